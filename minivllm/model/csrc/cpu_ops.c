/* The CPU custom ops of minivllm's model, float32 (the KV cache also float16 or bfloat16:
 * kv_dtype.h), called through ctypes (custom_ops.py).
 *
 * vLLM's model code calls custom kernels for the same jobs (vllm/_custom_ops.py):
 * rotary_embedding + reshape_and_cache, silu_and_mul, fused_add_rms_norm, and paged attention
 * (on CPU: ops.cpu_attention_with_kv_cache, vllm/v1/attention/backends/cpu_attn.py:449;
 * here in paged_attention.c);
 * skinny_linear (decode matmuls at batch 1-7) and argmax_rows (greedy sampling) are
 * minivllm's own.
 * In plain torch each is several ops over the batch, each op a pass over memory and a
 * dispatch; here each is one pass. custom_ops.py keeps the torch version of each as the
 * reference the tests compare against, and as the path for bfloat16 activations.
 *
 * Threads come from the OpenMP runtime torch already loaded (the same libgomp.so.1), so these
 * loops and torch's ops share one pool.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kv_dtype.h"

#define MAX_D 256
/* Below this many floats of work a loop runs on the calling thread, as torch does below its
 * GRAIN_SIZE (32768, ATen/Parallel.h): a parallel region costs a wake-up and a barrier, and on a
 * busy machine a sibling thread that is not scheduled holds the barrier for a time slice. */
#define PARALLEL_MIN 32768

/* A token's k and v heads into its cache slot, rounded to the cache's type (a constant kt). */
static inline __attribute__((always_inline)) void cache_token(
        const float *restrict row, int64_t H, int64_t KVH, int64_t D, void *restrict k_blocks,
        void *restrict v_blocks, int64_t NB, int64_t BS, int64_t slot, const int kt) {
    const int64_t block = slot / BS, offset = slot % BS;
    for (int64_t h = 0; h < KVH; h++) {
        const float *k = row + (H + h) * D, *v = row + (H + KVH + h) * D;
        const int64_t k0 = (h * NB + block) * D * BS + offset;  /* keys transposed */
        const int64_t v0 = ((h * NB + block) * BS + offset) * D;
        for (int64_t d = 0; d < D; d++) kv_store(k_blocks, k0 + d * BS, k[d], kt);
        for (int64_t d = 0; d < D; d++) kv_store(v_blocks, v0 + d, v[d], kt);
    }
}
#define CACHE_TOKEN(KT) cache_token(row, H, KVH, D, k_blocks, v_blocks, NB, BS, slots[i], KT)

/* RoPE on the q and k heads of each token's qkv row, in place, then k and v into the cache
 * (vLLM: rotary_embedding, vllm/_custom_ops.py:212, and reshape_and_cache, :2589).
 *   qkv (n, row_stride): H q heads, KVH k heads, KVH v heads of D floats each
 *   cos, sin (max_position, D): the rotate_half tables, sin carrying rotate_half's sign, so
 *   x' = x * cos + roll(x, D / 2) * sin;  k_blocks, v_blocks as for paged_decode
 *   (paged_attention.c), of kv_type (kv_dtype.h). -1: a head size or kv_type it does not take
 *   (nothing is written then). */
int rope_and_cache(float *restrict qkv, int64_t row_stride, int64_t n,
                   const int64_t *restrict positions, const float *restrict cos,
                   const float *restrict sin, int64_t H, int64_t KVH, int64_t D,
                   void *restrict k_blocks, void *restrict v_blocks, int64_t NB, int64_t BS,
                   const int64_t *restrict slots, int64_t kv_type) {
    if (D > MAX_D || D % 2 || !kv_type_ok(kv_type)) return -1;
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
        switch (kv_type) {  /* each case a constant type: one conversion per store */
            case KV_F16: CACHE_TOKEN(KV_F16); break;
            case KV_BF16: CACHE_TOKEN(KV_BF16); break;
            default: CACHE_TOKEN(KV_F32); break;
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
