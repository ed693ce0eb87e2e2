/* The CPU custom ops of minivllm's model, float32, called through ctypes (custom_ops.py).
 *
 * vLLM's model code calls custom kernels for the same jobs (vllm/_custom_ops.py):
 * rotary_embedding + reshape_and_cache, silu_and_mul, fused_add_rms_norm, and paged attention
 * (on CPU: ops.cpu_attention_with_kv_cache, vllm/v1/attention/backends/cpu_attn.py:449);
 * skinny_linear (decode matmuls at batch 1-7) and argmax_rows (greedy sampling) are
 * minivllm's own.
 * In plain torch each is several ops over the batch, each op a pass over memory and a
 * dispatch; here each is one pass. custom_ops.py keeps the torch version of each as the
 * reference the tests compare against, and as the path for bfloat16.
 *
 * Threads come from the OpenMP runtime torch already loaded (the same libgomp.so.1), so these
 * loops and torch's ops share one pool.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_G 8
#define MAX_D 256
#define MAX_BS 64
#define LINE_FLOATS 16  /* floats in a 64-byte cache line: the prefetch stride */
/* Below this many floats of work a loop runs on the calling thread, as torch does below its
 * GRAIN_SIZE (32768, ATen/Parallel.h): a parallel region costs a wake-up and a barrier, and on a
 * busy machine a sibling thread that is not scheduled holds the barrier for a time slice. */
#define PARALLEL_MIN 32768

/* RoPE on the q and k heads of each token's qkv row, in place, then k and v into the cache
 * (vLLM: rotary_embedding, vllm/_custom_ops.py:212, and reshape_and_cache, :2589).
 *   qkv (n, row_stride): H q heads, KVH k heads, KVH v heads of D floats each
 *   cos, sin (max_position, D): the rotate_half tables, sin carrying rotate_half's sign, so
 *   x' = x * cos + roll(x, D / 2) * sin;  k_blocks, v_blocks as for paged_decode below. */
int rope_and_cache(float *restrict qkv, int64_t row_stride, int64_t n,
                   const int64_t *restrict positions, const float *restrict cos,
                   const float *restrict sin, int64_t H, int64_t KVH, int64_t D,
                   float *restrict k_blocks, float *restrict v_blocks, int64_t NB, int64_t BS,
                   const int64_t *restrict slots) {
    if (D > MAX_D || D % 2) return -1;
    #pragma omp parallel for schedule(static) if(n > 1 && n * row_stride >= PARALLEL_MIN)
    for (int64_t i = 0; i < n; i++) {
        float *row = qkv + i * row_stride, x[MAX_D];
        const float *c = cos + positions[i] * D, *s = sin + positions[i] * D;
        for (int64_t h = 0; h < H + KVH; h++) {
            float *head = row + h * D;
            memcpy(x, head, sizeof(float) * D);
            #pragma omp simd
            for (int64_t d = 0; d < D / 2; d++) {
                head[d] = x[d] * c[d] + x[d + D / 2] * s[d];
                head[d + D / 2] = x[d + D / 2] * c[d + D / 2] + x[d] * s[d + D / 2];
            }
        }
        const int64_t block = slots[i] / BS, offset = slots[i] % BS;
        for (int64_t h = 0; h < KVH; h++) {
            const float *k = row + (H + h) * D, *v = row + (H + KVH + h) * D;
            float *kt = k_blocks + (h * NB + block) * D * BS + offset;
            for (int64_t d = 0; d < D; d++) kt[d * BS] = k[d];
            memcpy(v_blocks + ((h * NB + block) * BS + offset) * D, v, sizeof(float) * D);
        }
    }
    return 0;
}

/* out (n, I) = silu(x[:, :I]) * x[:, I:] for x (n, 2I) (vLLM: the silu_and_mul op,
 * vllm/model_executor/layers/activation.py:115). */
int silu_and_mul(const float *restrict x, float *restrict out, int64_t n, int64_t I) {
    #pragma omp parallel for schedule(static) if(n > 1 && n * I >= PARALLEL_MIN)
    for (int64_t i = 0; i < n; i++) {
        const float *gate = x + i * 2 * I, *up = gate + I;
        #pragma omp simd
        for (int64_t j = 0; j < I; j++) out[i * I + j] = gate[j] / (1.f + expf(-gate[j])) * up[j];
    }
    return 0;
}

/* y (M, N) = x (M, K) @ w^T for a few rows (decode at batch 1-7), w (N, K) row-major.
 * Memory-bound: every weight is read once and used M times. Each thread streams a contiguous
 * range of weight rows, two at a time (two accumulator chains per x row), prefetching ahead;
 * the x rows stay in L1. GCC vector extensions, as wide as the CPU's registers: a 64-byte
 * vector on a CPU without AVX-512 is split into pairs that gcc keeps on the stack, which ran
 * slower than torch there; 32 bytes keep the sums in AVX2 registers. */
#if defined(__AVX512F__)
typedef float vec __attribute__((vector_size(64)));
#define LANES 16
#else
typedef float vec __attribute__((vector_size(32)));
#define LANES 8
#endif
#define MAX_SKINNY 7

static inline vec load(const float *p) { vec v; memcpy(&v, p, sizeof v); return v; }

static inline float hsum(vec v) {
    float s = 0.f;
    for (int i = 0; i < LANES; i++) s += v[i];
    return s;
}

static inline __attribute__((always_inline)) void skinny_rows(
        const float *restrict x, const float *restrict w, float *restrict y, int64_t n0,
        int64_t N, int64_t K, const int M) {
    const float *w0 = w + n0 * K, *w1 = w0 + K;
    vec a0[MAX_SKINNY], a1[MAX_SKINNY];
    for (int m = 0; m < M; m++) a0[m] = a1[m] = (vec){0};
    int64_t k = 0;
    for (; k + LANES <= K; k += LANES) {
        __builtin_prefetch(w0 + k + 4 * K, 0, 0);  /* two row pairs ahead */
        __builtin_prefetch(w1 + k + 4 * K, 0, 0);
        const vec v0 = load(w0 + k), v1 = load(w1 + k);
        for (int m = 0; m < M; m++) {
            const vec xv = load(x + m * K + k);
            a0[m] += v0 * xv;
            a1[m] += v1 * xv;
        }
    }
    for (int m = 0; m < M; m++) {
        float s0 = hsum(a0[m]), s1 = hsum(a1[m]);
        for (int64_t j = k; j < K; j++) {
            s0 += w0[j] * x[m * K + j];
            s1 += w1[j] * x[m * K + j];
        }
        y[m * N + n0] = s0;
        y[m * N + n0 + 1] = s1;
    }
}

int skinny_linear(const float *restrict x, const float *restrict w, float *restrict y,
                  int64_t M, int64_t N, int64_t K) {
    if (M < 1 || M > MAX_SKINNY || N % 2) return -1;
    #pragma omp parallel for schedule(static)
    for (int64_t n0 = 0; n0 < N; n0 += 2) {
        switch (M) {  /* constant M: the loops over rows unroll, accumulators stay in registers */
            case 1: skinny_rows(x, w, y, n0, N, K, 1); break;
            case 2: skinny_rows(x, w, y, n0, N, K, 2); break;
            case 3: skinny_rows(x, w, y, n0, N, K, 3); break;
            case 4: skinny_rows(x, w, y, n0, N, K, 4); break;
            default: skinny_rows(x, w, y, n0, N, K, M); break;
        }
    }
    return 0;
}

/* out[i] = argmax of row i of x (n, V): the greedy token. A max, then the first index holding
 * it: two vectorised passes, about 3x torch's argmax on 32 x 49152 here. Rows with NaN give
 * some index of that row (the loop is bounded; fast-math assumes no NaN). */
int argmax_rows(const float *restrict x, int64_t *restrict out, int64_t n, int64_t V) {
    #pragma omp parallel for schedule(static) if(n > 1 && n * V >= PARALLEL_MIN)
    for (int64_t i = 0; i < n; i++) {
        const float *row = x + i * V;
        float m = row[0];
        #pragma omp simd reduction(max:m)
        for (int64_t j = 0; j < V; j++) m = row[j] > m ? row[j] : m;
        int64_t at = 0;
        while (at < V - 1 && row[at] != m) at++;
        out[i] = at;
    }
    return 0;
}

/* x += delta (when delta is not NULL), then out = x / rms(x) * weight (weight NULL: no scale),
 * row by row over (n, hidden) (vLLM: fused_add_rms_norm, vllm/_custom_ops.py:332). */
int add_rms_norm(float *restrict x, const float *restrict delta, const float *restrict weight,
                 float *restrict out, int64_t n, int64_t hidden, float eps) {
    #pragma omp parallel for schedule(static) if(n > 1 && n * hidden >= PARALLEL_MIN)
    for (int64_t i = 0; i < n; i++) {
        float *row = x + i * hidden, *o = out + i * hidden, sq = 0.f;
        if (delta) {
            const float *dr = delta + i * hidden;
            #pragma omp simd
            for (int64_t j = 0; j < hidden; j++) row[j] += dr[j];
        }
        #pragma omp simd reduction(+:sq)
        for (int64_t j = 0; j < hidden; j++) sq += row[j] * row[j];
        const float r = 1.f / sqrtf(sq / hidden + eps);
        if (weight) {
            #pragma omp simd
            for (int64_t j = 0; j < hidden; j++) o[j] = row[j] * r * weight[j];
        } else {
            #pragma omp simd
            for (int64_t j = 0; j < hidden; j++) o[j] = row[j] * r;
        }
    }
    return 0;
}

/* always_inline: called with constant G, D, BS the compiler unrolls the head loops and keeps
   the accumulators in registers; called with variables it is the general fallback. */
static inline __attribute__((always_inline)) void attend(
        const float *restrict qs, const float *restrict k_blocks, const float *restrict v_blocks,
        const int64_t *restrict table, int64_t len, float *restrict out, float *restrict scores,
        const int G, const int D, const int BS, int64_t kv_head, int64_t NB) {
    const int64_t num_blocks = (len + BS - 1) / BS, span = num_blocks * BS;
    if (len <= 0) {  /* nothing to attend to */
        memset(out, 0, sizeof(float) * G * D);
        return;
    }
    for (int64_t j = 0; j < num_blocks; j++) {  /* scores = q . k, a block at a time */
        const float *restrict kt = k_blocks + (kv_head * NB + table[j]) * D * BS;
        float acc[MAX_G][2][MAX_BS];  /* two chains per head hide the FMA latency */
        for (int g = 0; g < G; g++)
            for (int t = 0; t < BS; t++) acc[g][0][t] = acc[g][1][t] = 0.f;
        for (int d = 0; d + 1 < D; d += 2)
            for (int g = 0; g < G; g++) {
                const float q0 = qs[g * D + d], q1 = qs[g * D + d + 1];
                #pragma omp simd
                for (int t = 0; t < BS; t++) {
                    acc[g][0][t] += q0 * kt[d * BS + t];
                    acc[g][1][t] += q1 * kt[(d + 1) * BS + t];
                }
            }
        if (D % 2)  /* the last dimension of an odd head size */
            for (int g = 0; g < G; g++)
                for (int t = 0; t < BS; t++)
                    acc[g][0][t] += qs[g * D + D - 1] * kt[(D - 1) * BS + t];
        for (int g = 0; g < G; g++)
            for (int t = 0; t < BS; t++)
                scores[g * span + j * BS + t] = acc[g][0][t] + acc[g][1][t];
    }
    for (int g = 0; g < G; g++) {  /* softmax over the sequence's len tokens only */
        float *restrict s = scores + g * span, m = s[0], sum = 0.f;
        for (int64_t t = 1; t < len; t++) m = s[t] > m ? s[t] : m;
        for (int64_t t = 0; t < len; t++) { s[t] = expf(s[t] - m); sum += s[t]; }
        const float inv = 1.f / sum;
        for (int64_t t = 0; t < len; t++) s[t] *= inv;
    }
    float acc[MAX_G][MAX_D];  /* out = probs . v, a token row at a time */
    for (int g = 0; g < G; g++)
        for (int d = 0; d < D; d++) acc[g][d] = 0.f;
    for (int64_t t = 0; t < len; t++) {
        const float *restrict v = v_blocks + ((kv_head * NB + table[t / BS]) * BS + t % BS) * D;
        for (int g = 0; g < G; g++) {
            const float p = scores[g * span + t];
            #pragma omp simd
            for (int d = 0; d < D; d++) acc[g][d] += p * v[d];
        }
    }
    for (int g = 0; g < G; g++) memcpy(out + g * D, acc[g], sizeof(float) * D);
}

/* Decode attention over the paged KV cache: one query token per sequence. Plain torch must
 * gather every sequence's blocks into a dense copy before its matmuls can read them; this reads
 * the blocks where they lie, once, through the block table.
 *   q        (n, H, D)        rows q_stride apart; H query heads, KVH kv heads,
 *                             G = H / KVH queries per kv head
 *   k_blocks (KVH, NB, D, BS) each block's keys transposed: a block's BS scores are the BS
 *                             lanes of one vector, no horizontal sums
 *   v_blocks (KVH, NB, BS, D)
 *   tables   (n, max_blocks)  int64 block ids;  lens (n,) int64 tokens in each sequence
 *   out      (n, H, D)
 * Work item = (sequence, kv head): its G query heads share every key and value read.
 * Returns 0: done; -1: a shape past MAX_G, MAX_D, MAX_BS (the caller falls back to torch);
 * -2: no memory; -3: a sequence longer than its block table. */
int paged_decode(const float *restrict q, int64_t q_stride, const float *restrict k_blocks,
                 const float *restrict v_blocks, const int64_t *restrict tables,
                 const int64_t *restrict lens, float *restrict out, int64_t n, int64_t H,
                 int64_t KVH, int64_t D, int64_t NB, int64_t BS, int64_t max_blocks, float scale) {
    const int64_t G = H / KVH;
    if (G > MAX_G || D > MAX_D || BS > MAX_BS || G * KVH != H) return -1;
    for (int64_t s = 0; s < n; s++)
        if (lens[s] < 0 || lens[s] > max_blocks * BS) return -3;  /* past its block table */
    int failed = 0;
    #pragma omp parallel
    {
        float *scores = malloc(sizeof(float) * G * max_blocks * BS);
        float qs[MAX_G * MAX_D];
        if (!scores) {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp for schedule(static)
        for (int64_t item = 0; item < n * KVH; item++) {
            if (!scores) continue;
            const int64_t s = item / KVH, h = item % KVH;
            if (item + 1 < n * KVH) {  /* the next item's blocks, towards the cache, meanwhile */
                const int64_t s1 = (item + 1) / KVH, h1 = (item + 1) % KVH;
                for (int64_t j = 0; j < (lens[s1] + BS - 1) / BS; j++) {
                    const int64_t at = (h1 * NB + tables[s1 * max_blocks + j]) * BS * D;
                    for (int64_t c = 0; c < BS * D; c += LINE_FLOATS) {
                        __builtin_prefetch(k_blocks + at + c, 0, 1);
                        __builtin_prefetch(v_blocks + at + c, 0, 1);
                    }
                }
            }
            for (int64_t i = 0; i < G * D; i++) qs[i] = q[s * q_stride + h * G * D + i] * scale;
            const int64_t *table = tables + s * max_blocks;
            float *o = out + (s * H + h * G) * D;
            if (G == 3 && D == 64 && BS == 16)  /* SmolLM2 at the default block size */
                attend(qs, k_blocks, v_blocks, table, lens[s], o, scores, 3, 64, 16, h, NB);
            else
                attend(qs, k_blocks, v_blocks, table, lens[s], o, scores, G, D, BS, h, NB);
        }
        free(scores);
    }
    return failed ? -2 : 0;
}
