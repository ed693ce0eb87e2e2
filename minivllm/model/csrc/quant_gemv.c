// The GEMV (batch 1-5; quant_ops.c's q_linear sends those here): each block straight from
// memory into vector registers, no buffer. The bytes read are the blocks: 5 bits a weight for
// Q4_1, so at batch 1, where a decode step is a pass over every weight, this is the step.
//
// Rows in the file's layout: sum_j (d q_j + m) x_j = d (q . x) + m sum(x): one multiply-add by
// d per block, the block sums of x computed once. A block's d and m (two fp16) become floats
// in one conversion, and its m sum(x) goes into a 2-lane accumulator against the pair
// (-8 sum(x), 0) for Q4_0 or (0, sum(x)) for Q4_1 (Q8_0: (0, 0)), so no scalar work is left
// per block. On Zen 4 this took a Q4_1 row from 5.7 to 4.7 cycles a block, and there it stops:
// a matrix that fits in cache runs no faster, the loop is bound by its vector instructions,
// and a third of them (convert d and m, broadcast d, the scaling multiply-add, a chain from
// block to block) are per block, not per weight.
//
// Packed rows (quant_blocks.h, repacked at load) take that third away: a group
// of 16 blocks lies with the blocks across the lanes, so one load and conversion gives all 16
// d's (and m's), and the 32 steps of the group are plain multiply-adds of 16 quants (byte i of
// each block) against x in the same lane order, lane j summing block j's q . x. The group then
// ends in one vector multiply-add by its d's. x is permuted into lane order once per call
// (to_lane_order). On Zen 4, one thread, SmolLM2's four layer shapes x 30 layers (66 MB of Q4_1,
// scripts/q_gemv_bench.c): 1.93 -> 1.61 ns a block at best (10.4 -> 12.4 GB/s, 1.2x; K = 576
// leaves a tail of 2 blocks in 18 in the file's layout), Q4_0 2.14 -> 1.59 ns (1.35x); one
// layer, in cache, 1.82 -> 1.42 ns (1.28x). The decode step at batch 1: 1.2x. Q8_0 (SmolLM2's
// output head, 49152 x 576, 30 MB), two threads: 27.1 -> 34.3 GB/s (1.27x).
#include <stdlib.h>

#include "quant_blocks.h"

#if defined(__AVX512F__) || defined(__AVX2__)
static inline __m128 block_dm(const uint8_t *blk, int64_t qtype) {  // (d, m or 0, 0, 0)
    uint32_t bits = 0;
    memcpy(&bits, blk, qtype == GGML_Q4_1 ? 4 : 2);
    return _mm_cvtph_ps(_mm_cvtsi32_si128((int)bits));
}

// acc += d (q . x) by block over nb blocks in the file's layout, am += (d, m) . pairs.
static inline __attribute__((always_inline)) fvec blocks_dot(
        const uint8_t *row, int64_t qtype, int64_t nb, const float *x, const float *pairs,
        fvec acc, __m128 *am) {
    const int bs = block_bytes(qtype);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = row + b * bs;
        const float *xb = x + b * QK;
        const __m128 dm = block_dm(blk, qtype);
        *am = _mm_fmadd_ps(dm, _mm_castsi128_ps(_mm_loadl_epi64((const __m128i *)(pairs + 2 * b))),
                           *am);
#if defined(__AVX512F__)
        __m512 lo, hi;
        if (qtype == GGML_Q8_0) {
            lo = widen16(_mm_loadu_si128((const __m128i *)(blk + 2)), qtype);
            hi = widen16(_mm_loadu_si128((const __m128i *)(blk + 18)), qtype);
        } else {  // both nibbles of a byte from one zero-extension
            const ivec v = widen_u8(blk + scale_bytes(qtype));
            lo = low_nibbles(v);
            hi = high_nibbles(v);
        }
        const __m512 t = _mm512_fmadd_ps(hi, _mm512_loadu_ps(xb + 16),
                                         _mm512_mul_ps(lo, _mm512_loadu_ps(xb)));
        acc = _mm512_fmadd_ps(_mm512_broadcastss_ps(dm), t, acc);
#else
        __m128i lo, hi;
        block_quants(blk, qtype, &lo, &hi);
        __m256 t = _mm256_setzero_ps();
        const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
        for (int i = 0; i < 4; i++)
            t = _mm256_fmadd_ps(widen8(parts[i], qtype), _mm256_loadu_ps(xb + 8 * i), t);
        acc = _mm256_fmadd_ps(_mm256_broadcastss_ps(dm), t, acc);
#endif
    }
    return acc;
}

// acc += d (q . x) + m c by block over ng packed groups, x in lane order, c per block: sum(x)
// for Q4_1, -8 sum(x) for Q4_0 (whose m is -8 d), nothing for Q8_0 (m = 0). Each LANES-wide
// slice of a group in turn.
static inline __attribute__((always_inline)) fvec groups_dot(
        const uint8_t *row, int64_t qtype, int64_t ng, const float *x, const float *c, fvec acc) {
    const int sb = scale_bytes(qtype), group_bytes = GROUP * block_bytes(qtype);
    for (int64_t g = 0; g < ng; g++, row += group_bytes, x += GROUP * QK, c += GROUP) {
        const uint8_t *q = row + GROUP * sb;
        for (int h = 0; h < GROUP; h += LANES) {
            fvec a[4] = {0};  // four chains: bytes t + i (Q8_0), or both nibbles of two bytes
            if (qtype == GGML_Q8_0) {  // a byte a weight
                for (int t = 0; t < QK; t += 4)
                    for (int i = 0; i < 4; i++)
                        a[i] = fmadd(widen_i8(q + (t + i) * GROUP + h),
                                     loadf(x + (t + i) * GROUP + h), a[i]);
                acc = fmadd(load_halves(row + 2 * h), (a[0] + a[1]) + (a[2] + a[3]), acc);
                continue;
            }
            for (int i = 0; i < 16; i += 2) {
                const ivec v0 = widen_u8(q + i * GROUP + h), v1 = widen_u8(q + (i + 1) * GROUP + h);
                a[0] = fmadd(low_nibbles(v0), loadf(x + i * GROUP + h), a[0]);
                a[1] = fmadd(high_nibbles(v0), loadf(x + (i + 16) * GROUP + h), a[1]);
                a[2] = fmadd(low_nibbles(v1), loadf(x + (i + 1) * GROUP + h), a[2]);
                a[3] = fmadd(high_nibbles(v1), loadf(x + (i + 17) * GROUP + h), a[3]);
            }
            const fvec s = (a[0] + a[1]) + (a[2] + a[3]), d = load_halves(row + 2 * h);
            if (qtype == GGML_Q4_1)
                acc = fmadd(d, s, fmadd(load_halves(row + 2 * GROUP + 2 * h), loadf(c + h), acc));
            else
                acc = fmadd(d, s + loadf(c + h), acc);
        }
    }
    return acc;
}

static inline float reduce(fvec acc, __m128 am) {
#if defined(__AVX512F__)
    float sum = _mm512_reduce_add_ps(acc);
#else
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    float sum = _mm_cvtss_f32(s);
#endif
    return sum + _mm_cvtss_f32(am) + _mm_cvtss_f32(_mm_movehdup_ps(am));
}

// One output: ng packed groups (0 for a row in the file's layout), then the rest as blocks.
static inline __attribute__((always_inline)) float row_dot(
        const uint8_t *row, int64_t qtype, int64_t ng, int64_t nb, const float *x,
        const float *c, const float *pairs) {
    __m128 am = _mm_setzero_ps();
    fvec acc = groups_dot(row, qtype, ng, x, c, (fvec){0});
    const int64_t done = ng * GROUP;
    acc = blocks_dot(row + done * block_bytes(qtype), qtype, nb - done, x + done * QK,
                     pairs + 2 * done, acc, &am);
    return reduce(acc, am);
}

// Rows n of out for one row of x, with the row_dot specialised for qtype.
#define GEMV_LOOP(QT)                                                                        \
    _Pragma("omp for schedule(static)")                                                      \
    for (int64_t n = 0; n < N; n++)                                                          \
        for (int64_t m = 0; m < M; m++)                                                      \
            out[m * N + n] = row_dot(w + n * row_bytes, QT, ng, nb, xs + m * K, c + m * nb,  \
                                     pairs + m * 2 * nb)

// Per block of x: m's partners (pairs, see above) and their sum (c); x in lane order over ng
// packed groups (xl).
static void block_sums(const float *x, int64_t M, int64_t K, int64_t qtype, int64_t ng,
                       float *pairs, float *c, float *xl) {
    for (int64_t i = 0; i < M * K / QK; i++) {
        float s = 0.f;
        for (int j = 0; j < QK; j++) s += x[i * QK + j];
        pairs[2 * i] = qtype == GGML_Q4_0 ? -8.f * s : 0.f;
        pairs[2 * i + 1] = qtype == GGML_Q4_1 ? s : 0.f;
        c[i] = pairs[2 * i] + pairs[2 * i + 1];
    }
    for (int64_t m = 0; ng && m < M; m++) to_lane_order(x + m * K, K, ng, xl + m * K, 1);
}

int quant_gemv(const float *x, const uint8_t *w, float *out, int64_t M, int64_t N, int64_t K,
               int64_t qtype) {
    const int packed = take_packed(&qtype);
    const int64_t nb = K / QK, ng = packed ? nb / GROUP : 0, row_bytes = nb * block_bytes(qtype);
    float *pairs = malloc(sizeof(float) * M * (3 * nb + (ng ? K : 0)));
    if (pairs == NULL) return -2;
    float *c = pairs + 2 * M * nb, *xl = c + M * nb;
    block_sums(x, M, K, qtype, ng, pairs, c, xl);
    const float *xs = ng ? xl : x;
#pragma omp parallel
    {
        if (qtype == GGML_Q4_1) GEMV_LOOP(GGML_Q4_1);
        else if (qtype == GGML_Q4_0) GEMV_LOOP(GGML_Q4_0);
        else GEMV_LOOP(GGML_Q8_0);
    }
    free(pairs);
    return 0;
}
#else
int quant_gemv(const float *x, const uint8_t *w, float *out, int64_t M, int64_t N, int64_t K,
               int64_t qtype) {
    return -1;  // no vector GEMV in a build without AVX2 (GEMV_ROWS is 0 there)
}
#endif
