// The batch-1 Q4 GEMV on SmolLM2-135M's layer matrices (30 layers of qkv 960x576, o 576x576,
// gate_up 3072x576, down 576x1536: 66 MB of Q4_1 blocks, more than the cache holds), rows in
// the file's layout against the same rows packed (q_repack). Prints GB/s of blocks read and
// ns per 32-weight block per thread, best and median of the rounds. Fewer layers (the third
// argument) fit in the cache: what the kernel does when memory is not the limit.
//
//   cd minivllm/model/csrc && gcc -O3 -march=native -mprefer-vector-width=512 -ffast-math
//       -fopenmp ../../../scripts/q_gemv_bench.c quant_ops.c quant_gemv.c -lm -o /tmp/qb
//   OMP_NUM_THREADS=1 /tmp/qb [qtype: 3 Q4_1 (default), 2 Q4_0] [rounds] [layers, 1-30]
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int q_linear(const float *x, const uint8_t *w, float *out, int64_t M, int64_t N, int64_t K,
             int64_t qtype);
int q_repack(const uint8_t *src, uint8_t *dst, int64_t N, int64_t K, int64_t qtype);

enum { MAX_LAYERS = 30, MATS = 4, PACKED = 0x100 };
static const int64_t SHAPES[MATS][2] = {{960, 576}, {576, 576}, {3072, 576}, {576, 1536}};

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

static int cmp(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

// Random blocks of qtype, every d 1/64 and m -1/8 in fp16 (the op_selection.py choice).
static uint8_t *random_blocks(int64_t n, int bs, int64_t qtype) {
    uint8_t *w = malloc(n * bs);
    const uint16_t d = 0x2400, m = 0xb000;
    for (int64_t i = 0; i < n * bs; i++) w[i] = (uint8_t)rand();
    for (int64_t b = 0; b < n; b++) {
        memcpy(w + b * bs, &d, 2);
        if (qtype == 3) memcpy(w + b * bs + 2, &m, 2);
    }
    return w;
}

int main(int argc, char **argv) {
    const int64_t qtype = argc > 1 ? atoi(argv[1]) : 3, rounds = argc > 2 ? atoi(argv[2]) : 30;
    const int layers = argc > 3 ? atoi(argv[3]) : MAX_LAYERS, bs = qtype == 3 ? 20 : 18;
    if (layers < 1 || layers > MAX_LAYERS || rounds < 1) return fprintf(stderr, "bad args\n"), 1;
    uint8_t *w[MAX_LAYERS * MATS], *p[MAX_LAYERS * MATS];
    float *x = malloc(sizeof(float) * 1536), *out[2];
    int64_t bytes = 0, blocks = 0;
    srand(1);
    for (int i = 0; i < 1536; i++) x[i] = rand() / (float)RAND_MAX - 0.5f;
    for (int i = 0; i < layers * MATS; i++) {
        const int64_t N = SHAPES[i % MATS][0], K = SHAPES[i % MATS][1];
        w[i] = random_blocks(N * K / 32, bs, qtype);
        p[i] = malloc(N * K / 32 * bs);
        if (q_repack(w[i], p[i], N, K, qtype)) return fprintf(stderr, "q_repack failed\n"), 1;
        bytes += N * K / 32 * bs;
        blocks += N * K / 32;
    }
    double worst = 0;  // the two layouts' outputs, relative to the largest
    for (int i = 0; i < MATS; i++) {
        const int64_t N = SHAPES[i][0], K = SHAPES[i][1];
        for (int l = 0; l < 2; l++) out[l] = malloc(sizeof(float) * N);
        q_linear(x, w[i], out[0], 1, N, K, qtype);
        q_linear(x, p[i], out[1], 1, N, K, qtype | PACKED);
        double big = 0, diff = 0;
        for (int64_t n = 0; n < N; n++) {
            big = fmax(big, fabs(out[0][n]));
            diff = fmax(diff, fabs(out[0][n] - out[1][n]));
        }
        worst = fmax(worst, diff / big);
        for (int l = 0; l < 2; l++) free(out[l]);
    }
    float *y = malloc(sizeof(float) * 3072);
    double *t = malloc(sizeof(double) * rounds);
    for (int packed = 0; packed < 2; packed++) {
        for (int r = 0; r < rounds; r++) {
            const double t0 = now();
            for (int i = 0; i < layers * MATS; i++)
                q_linear(x, packed ? p[i] : w[i], y, 1, SHAPES[i % MATS][0], SHAPES[i % MATS][1],
                         qtype | (packed ? PACKED : 0));
            t[r] = now() - t0;
        }
        qsort(t, rounds, sizeof(double), cmp);
        const int threads = omp_get_max_threads();
        printf("%s Q4_%d, %d thread(s), %.1f MB: best %.2f GB/s %.2f ns/block, median %.2f GB/s "
               "%.2f ns/block\n", packed ? "packed" : "file  ", qtype == 3 ? 1 : 0, threads,
               bytes / 1e6, bytes / t[0] / 1e9, t[0] / blocks * 1e9 * threads,
               bytes / t[rounds / 2] / 1e9, t[rounds / 2] / blocks * 1e9 * threads);
    }
    printf("largest difference between the layouts: %.1e of the largest output\n", worst);
    return 0;
}
