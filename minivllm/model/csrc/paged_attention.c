/* Decode attention over the paged KV cache (vLLM on CPU: ops.cpu_attention_with_kv_cache,
 * vllm/v1/attention/backends/cpu_attn.py:449), float32 arithmetic over a cache of float32,
 * float16 or bfloat16 (kv_dtype.h). Its torch version is attention.decode_torch. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kv_dtype.h"

#define MAX_G 8
#define MAX_D 256
#define MAX_BS 64
#define LINE_BYTES 64  /* a cache line: the prefetch stride */

/* The scores of one block, s[g * span + t] = q_g . k_t for its BS tokens, its keys transposed
 * (D, BS) from k0. Two accumulator chains per head hide the FMA latency. block_scores_vec loads
 * whole vectors of keys (BS a multiple of KV_LANES; a 16-bit cache is widened in registers),
 * block_scores_one one key at a time; each lane adds in the same order in both. */
static inline __attribute__((always_inline)) void block_scores_vec(
        const float *restrict qs, const void *restrict kb, int64_t k0, float *restrict s,
        int64_t span, const int G, const int D, const int BS, const int KT) {
    kv_vec acc[MAX_G][2][MAX_BS / KV_LANES];
    for (int g = 0; g < G; g++)
        for (int c = 0; c < BS / KV_LANES; c++) acc[g][0][c] = acc[g][1][c] = (kv_vec){0};
    for (int d = 0; d + 1 < D; d += 2)
        for (int c = 0; c < BS / KV_LANES; c++) {
            const kv_vec x0 = kv_load_vec(kb, k0 + d * BS + c * KV_LANES, KT);
            const kv_vec x1 = kv_load_vec(kb, k0 + (d + 1) * BS + c * KV_LANES, KT);
            for (int g = 0; g < G; g++) {
                acc[g][0][c] += qs[g * D + d] * x0;
                acc[g][1][c] += qs[g * D + d + 1] * x1;
            }
        }
    if (D % 2)  /* the last dimension of an odd head size */
        for (int c = 0; c < BS / KV_LANES; c++) {
            const kv_vec x = kv_load_vec(kb, k0 + (D - 1) * BS + c * KV_LANES, KT);
            for (int g = 0; g < G; g++) acc[g][0][c] += qs[g * D + D - 1] * x;
        }
    for (int g = 0; g < G; g++)
        for (int c = 0; c < BS / KV_LANES; c++) {
            const kv_vec sum = acc[g][0][c] + acc[g][1][c];
            memcpy(s + g * span + c * KV_LANES, &sum, sizeof sum);
        }
}

static inline __attribute__((always_inline)) void block_scores_one(
        const float *restrict qs, const void *restrict kb, int64_t k0, float *restrict s,
        int64_t span, const int G, const int D, const int BS, const int KT) {
    float acc[MAX_G][2][MAX_BS];
    for (int g = 0; g < G; g++)
        for (int t = 0; t < BS; t++) acc[g][0][t] = acc[g][1][t] = 0.f;
    for (int d = 0; d + 1 < D; d += 2)
        for (int g = 0; g < G; g++) {
            const float q0 = qs[g * D + d], q1 = qs[g * D + d + 1];
            #pragma omp simd
            for (int t = 0; t < BS; t++) {
                acc[g][0][t] += q0 * kv_load(kb, k0 + d * BS + t, KT);
                acc[g][1][t] += q1 * kv_load(kb, k0 + (d + 1) * BS + t, KT);
            }
        }
    if (D % 2)
        for (int g = 0; g < G; g++)
            for (int t = 0; t < BS; t++)
                acc[g][0][t] += qs[g * D + D - 1] * kv_load(kb, k0 + (D - 1) * BS + t, KT);
    for (int g = 0; g < G; g++)
        for (int t = 0; t < BS; t++) s[g * span + t] = acc[g][0][t] + acc[g][1][t];
}

/* acc[g] += p[g] * v for one token's value row v (D from v0): whole vectors where D is a
 * multiple of KV_LANES, else one element at a time. */
static inline __attribute__((always_inline)) void add_value(
        float acc[MAX_G][MAX_D], const float *restrict p, int64_t stride,
        const void *restrict vb, int64_t v0, const int G, const int D, const int KT) {
    if (D % KV_LANES == 0) {
        for (int c = 0; c < D; c += KV_LANES) {
            const kv_vec v = kv_load_vec(vb, v0 + c, KT);
            for (int g = 0; g < G; g++) {
                kv_vec a;
                memcpy(&a, acc[g] + c, sizeof a);
                a += p[g * stride] * v;
                memcpy(acc[g] + c, &a, sizeof a);
            }
        }
        return;
    }
    for (int g = 0; g < G; g++) {
        #pragma omp simd
        for (int d = 0; d < D; d++) acc[g][d] += p[g * stride] * kv_load(vb, v0 + d, KT);
    }
}

/* always_inline: called with constant G, D, BS the compiler unrolls the head loops and keeps
   the accumulators in registers; called with variables it is the general fallback. KT, the
   cache's element type, is always a constant. */
static inline __attribute__((always_inline)) void attend(
        const float *restrict qs, const void *restrict k_blocks, const void *restrict v_blocks,
        const int64_t *restrict table, int64_t len, float *restrict out, float *restrict scores,
        const int G, const int D, const int BS, int64_t kv_head, int64_t NB, const int KT) {
    const int64_t num_blocks = (len + BS - 1) / BS, span = num_blocks * BS;
    if (len <= 0) {  /* nothing to attend to */
        memset(out, 0, sizeof(float) * G * D);
        return;
    }
    for (int64_t j = 0; j < num_blocks; j++) {  /* scores = q . k, a block at a time */
        const int64_t k0 = (kv_head * NB + table[j]) * D * BS;
        if (BS % KV_LANES == 0)
            block_scores_vec(qs, k_blocks, k0, scores + j * BS, span, G, D, BS, KT);
        else
            block_scores_one(qs, k_blocks, k0, scores + j * BS, span, G, D, BS, KT);
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
    for (int64_t t = 0; t < len; t++)
        add_value(acc, scores + t, span, v_blocks,
                  ((kv_head * NB + table[t / BS]) * BS + t % BS) * D, G, D, KT);
    for (int g = 0; g < G; g++) memcpy(out + g * D, acc[g], sizeof(float) * D);
}

/* attend for one cache type: SmolLM2's shape at the default block size with its sizes as
 * constants, any other with variables. */
#define ATTEND(KT) (G == 3 && D == 64 && BS == 16                                         \
    ? attend(qs, k_blocks, v_blocks, table, len, out, scores, 3, 64, 16, kv_head, NB, KT) \
    : attend(qs, k_blocks, v_blocks, table, len, out, scores, G, D, BS, kv_head, NB, KT))

static void attend_any(const float *qs, const void *k_blocks, const void *v_blocks,
                       const int64_t *table, int64_t len, float *out, float *scores, int G,
                       int D, int BS, int64_t kv_head, int64_t NB, int64_t kv_type) {
    switch (kv_type) {
        case KV_F16: ATTEND(KV_F16); break;
        case KV_BF16: ATTEND(KV_BF16); break;
        default: ATTEND(KV_F32); break;
    }
}

/* The blocks of a sequence, towards the cache, while the item before it is computed. */
static void prefetch_blocks(const void *k_blocks, const void *v_blocks, const int64_t *table,
                            int64_t len, int64_t h, int64_t NB, int64_t BS, int64_t D,
                            int64_t itemsize) {
    const int64_t block_bytes = BS * D * itemsize;
    for (int64_t j = 0; j < (len + BS - 1) / BS; j++) {
        const int64_t at = (h * NB + table[j]) * block_bytes;
        for (int64_t c = 0; c < block_bytes; c += LINE_BYTES) {
            __builtin_prefetch((const char *)k_blocks + at + c, 0, 1);
            __builtin_prefetch((const char *)v_blocks + at + c, 0, 1);
        }
    }
}

/* Decode attention over the paged KV cache: one query token per sequence. Plain torch must
 * gather every sequence's blocks into a dense copy before its matmuls can read them; this reads
 * the blocks where they lie, once, through the block table.
 *   q        (n, H, D)        rows q_stride apart; H query heads, KVH kv heads,
 *                             G = H / KVH queries per kv head
 *   k_blocks (KVH, NB, D, BS) each block's keys transposed: a block's BS scores are the BS
 *                             lanes of one vector, no horizontal sums
 *   v_blocks (KVH, NB, BS, D) both of kv_type (kv_dtype.h: 0 float32, 1 float16, 2 bfloat16)
 *   tables   (n, max_blocks)  int64 block ids;  lens (n,) int64 tokens in each sequence
 *   out      (n, H, D)
 * Work item = (sequence, kv head): its G query heads share every key and value read.
 * Returns 0: done; -1: a shape past MAX_G, MAX_D, MAX_BS or an unknown kv_type (the caller falls
 * back to torch); -2: no memory; -3: a sequence longer than its block table. */
int paged_decode(const float *restrict q, int64_t q_stride, const void *restrict k_blocks,
                 const void *restrict v_blocks, const int64_t *restrict tables,
                 const int64_t *restrict lens, float *restrict out, int64_t n, int64_t H,
                 int64_t KVH, int64_t D, int64_t NB, int64_t BS, int64_t max_blocks, float scale,
                 int64_t kv_type) {
    const int64_t G = H / KVH;
    if (G > MAX_G || D > MAX_D || BS > MAX_BS || G * KVH != H || !kv_type_ok(kv_type)) return -1;
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
            if (item + 1 < n * KVH) {
                const int64_t s1 = (item + 1) / KVH;
                prefetch_blocks(k_blocks, v_blocks, tables + s1 * max_blocks, lens[s1],
                                (item + 1) % KVH, NB, BS, D, kv_itemsize(kv_type));
            }
            for (int64_t i = 0; i < G * D; i++) qs[i] = q[s * q_stride + h * G * D + i] * scale;
            attend_any(qs, k_blocks, v_blocks, tables + s * max_blocks, lens[s],
                       out + (s * H + h * G) * D, scores, G, D, BS, h, NB, kv_type);
        }
        free(scores);
    }
    return failed ? -2 : 0;
}
