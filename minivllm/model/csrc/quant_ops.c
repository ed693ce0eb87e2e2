// Linear layers on a GGUF's own quantized blocks: y = x @ W^T for float32 activations x (M, K)
// and W (N, K) stored as ggml blocks of 32 weights (quant_blocks.h), dequantized inside the
// kernel; q_repack packs a matrix's rows for the GEMV (quant_blocks.h, quant_gemv.c).
//
// Batches of 1-5 rows (decode at batch 1): the GEMV (quant_gemv.c), each block from memory
// into registers. Larger batches: the GEMM, which unpacks each block once into a small float
// panel and runs every row of the batch against it with a register-blocked micro-kernel (see
// gemm below). Both use AVX-512 or AVX2 intrinsics, whichever the build's -march has
// (csrc_build.py: native, or x86-64-v3 for AVX2 only); a build with neither runs the GEMM on
// plain C, and takes no packed rows.
#include <stdlib.h>

#include "quant_blocks.h"
#include "thread_scratch.h"

// nb blocks in the file's layout -> nb * 32 floats, the values gguf-py's dequantize gives.
static void unpack_blocks(const uint8_t *src, int64_t qtype, int64_t nb, float *restrict w) {
    const int bs = block_bytes(qtype);
    for (int64_t b = 0; b < nb; b++, w += QK) {
        const uint8_t *blk = src + b * bs;
        const float d = half_to_float(blk), m = block_min(blk, qtype, d);
#if defined(__AVX512F__) || defined(__AVX2__)
        __m128i lo, hi;
        block_quants(blk, qtype, &lo, &hi);
#if defined(__AVX512F__)
        const __m512 dv = _mm512_set1_ps(d), mv = _mm512_set1_ps(m);
        _mm512_storeu_ps(w, _mm512_fmadd_ps(widen16(lo, qtype), dv, mv));
        _mm512_storeu_ps(w + 16, _mm512_fmadd_ps(widen16(hi, qtype), dv, mv));
#else
        const __m256 dv = _mm256_set1_ps(d), mv = _mm256_set1_ps(m);
        const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
        for (int i = 0; i < 4; i++)
            _mm256_storeu_ps(w + 8 * i, _mm256_fmadd_ps(widen8(parts[i], qtype), dv, mv));
#endif
#else
        for (int j = 0; j < QK; j++) {
            const uint8_t *q = blk + scale_bytes(qtype);
            const int v = qtype == GGML_Q8_0 ? (int8_t)q[j] : (q[j % 16] >> (j / 16 * 4)) & 0xf;
            w[j] = (float)v * d + m;
        }
#endif
    }
}

#if defined(__AVX512F__) || defined(__AVX2__)
// One packed group -> GROUP * 32 floats in lane order (weight t of block j at t * GROUP + j).
static void unpack_group(const uint8_t *src, int64_t qtype, float *restrict w) {
    const uint8_t *q = src + GROUP * scale_bytes(qtype);
    for (int h = 0; h < GROUP; h += LANES) {
        const fvec d = load_halves(src + 2 * h);
        if (qtype == GGML_Q8_0) {
            for (int t = 0; t < QK; t++) {
                const fvec v = widen_i8(q + t * GROUP + h) * d;
                memcpy(w + t * GROUP + h, &v, sizeof(v));
            }
            continue;
        }
        const fvec m = qtype == GGML_Q4_1 ? load_halves(src + 2 * GROUP + 2 * h) : (fvec)(d * -8.f);
        for (int i = 0; i < 16; i++) {
            const ivec v = widen_u8(q + i * GROUP + h);
            const fvec lo = fmadd(low_nibbles(v), d, m), hi = fmadd(high_nibbles(v), d, m);
            memcpy(w + i * GROUP + h, &lo, sizeof(lo));
            memcpy(w + (i + 16) * GROUP + h, &hi, sizeof(hi));
        }
    }
}
#else
static void unpack_group(const uint8_t *src, int64_t qtype, float *restrict w) {
    abort();  // unreachable: q_linear refuses packed rows in a build without AVX2
}
#endif

// One row of nb blocks, its first ng groups packed -> nb * 32 floats (the groups in lane order).
static void unpack_row(const uint8_t *src, int64_t qtype, int64_t ng, int64_t nb,
                       float *restrict w) {
    const int64_t group_bytes = GROUP * block_bytes(qtype);
    for (int64_t g = 0; g < ng; g++) unpack_group(src + g * group_bytes, qtype, w + g * GROUP * QK);
    unpack_blocks(src + ng * group_bytes, qtype, nb - ng * GROUP, w + ng * GROUP * QK);
}

// The batched GEMM (batch 6 and up): out^T = W x^T. Each thread takes NR output rows at a
// time, unpacks their blocks once (NR * K floats, in L1/L2) and runs them against every chunk
// of rows of x, which the threads transpose together into (K, chunk) panels. The micro-kernel
// holds NR x 2 vectors of sums in registers over the whole of K; per k it loads two vectors of
// x and broadcasts each row's one weight: 2 NR multiply-adds for NR + 2 loads, so it is bound
// by arithmetic. A last chunk of one vector's rows or fewer runs on one vector (half the
// padding). While a tile computes, the next tile's blocks are prefetched: a step reads each
// layer's weights from memory once, and unpacking them is otherwise a wait on each line.
#if defined(__AVX512F__)
enum { VW = 16, NR = 12 };  // 24 of the 32 zmm registers hold sums
#elif defined(__AVX2__)
enum { VW = 8, NR = 6 };  // 12 of the 16 ymm registers
#else
enum { VW = 4, NR = 6 };  // 128-bit vectors (SSE, NEON): 12 registers
#endif
enum { MC = 2 * VW };  // rows of x per chunk
typedef float vf __attribute__((vector_size(VW * 4)));

// res[r][l] = sum over k of wt[r][k] xt[k][l], for l < nv * VW: output row r, row l of the
// chunk (res's rows are MC apart). Sums over all of K stay in registers: blocking k into L1-sized
// passes measured 3-5% slower, for nothing the hardware prefetcher does not already do.
static inline __attribute__((always_inline)) void micro_kernel(
        const float *restrict xt, const float *restrict wt, int64_t K, float *restrict res,
        const int nv) {
    vf acc[NR][2];
    memset(acc, 0, sizeof(acc));
    for (int64_t k = 0; k < K; k++) {
        vf x0, x1;
        memcpy(&x0, xt + k * nv * VW, sizeof(vf));
        if (nv == 2) memcpy(&x1, xt + k * nv * VW + VW, sizeof(vf));
#pragma GCC unroll 16
        for (int r = 0; r < NR; r++) {
            const float w = wt[r * K + k];
            acc[r][0] += x0 * w;
            if (nv == 2) acc[r][1] += x1 * w;
        }
    }
    memcpy(res, acc, sizeof(acc));
}

// The chunk of x from row m0 (MC rows, or VW for a last one of VW rows or fewer).
static inline int64_t chunk_rows(int64_t M, int64_t m0) { return M - m0 > VW ? MC : VW; }

// The output rows of the tile from row n0 of N (NR, fewer for the last; 0 past the end).
static inline int64_t tile_height(int64_t N, int64_t n0) {
    return N - n0 < NR ? (N - n0 > 0 ? N - n0 : 0) : NR;
}

// Buffer `which` of this thread (thread_scratch.h), at least n floats.
static float *scratch(int which, int64_t n) {
    static __thread void *buf[2];
    static __thread size_t cap[2];
    return grow_scratch(&buf[which], &cap[which], sizeof(float) * n);
}

// Row m of x into its chunk of xt, each chunk (K, chunk rows) from xt + m0 * K, zero past row
// M; k in lane order (quant_blocks.h) over ng packed groups: the sum over k does not mind its
// order.
static void transpose_row(const float *x, int64_t M, int64_t K, int64_t ng, float *xt,
                          int64_t m) {
    const int64_t m0 = m / MC * MC, rows = chunk_rows(M, m0), l = m - m0;
    if (m < M) to_lane_order(x + m * K, K, ng, xt + m0 * K + l, rows);
    else for (int64_t k = 0; k < K; k++) xt[m0 * K + k * rows + l] = 0.f;
}

// Brings the bytes at p into the cache ahead of their use.
static inline void prefetch(const uint8_t *p, int64_t bytes) {
    for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(p + b, 0, 2);
}

// Output rows n0 .. n0 + rows (unpacked in wt) for every row of x.
static void tile_rows(const float *xt, const float *wt, float *out, int64_t M, int64_t N,
                      int64_t K, int64_t n0, int64_t rows) {
    float res[NR * MC];
    for (int64_t m0 = 0; m0 < M; m0 += chunk_rows(M, m0)) {
        const int64_t width = chunk_rows(M, m0);
        if (width == MC) micro_kernel(xt + m0 * K, wt, K, res, 2);
        else micro_kernel(xt + m0 * K, wt, K, res, 1);
        for (int64_t l = 0; l < width && m0 + l < M; l++)
            for (int64_t r = 0; r < rows; r++) out[(m0 + l) * N + n0 + r] = res[r * MC + l];
    }
}

static int gemm(const float *x, const uint8_t *w, float *out, int64_t M, int64_t N, int64_t K,
                int64_t qtype) {
    const int packed = take_packed(&qtype);
    const int64_t nb = K / QK, row_bytes = nb * block_bytes(qtype), tiles = (N + NR - 1) / NR;
    const int64_t ng = packed ? nb / GROUP : 0, last = (M - 1) / MC * MC;
    const int64_t padded = last + chunk_rows(M, last);  // x's rows with the last chunk's padding
    float *xt = scratch(0, K * padded);
    if (xt == NULL) return -2;
    int failed = 0;
#pragma omp parallel
    {
        float *wt = scratch(1, NR * K);
        if (wt == NULL) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static, VW)  // a vector of rows each: no cache line is written by two
        for (int64_t m = 0; m < padded; m++) transpose_row(x, M, K, ng, xt, m);
#pragma omp for schedule(static)
        for (int64_t t = 0; t < tiles; t++) {
            if (wt == NULL) continue;
            const int64_t n0 = t * NR, rows = tile_height(N, n0), next = tile_height(N, n0 + NR);
            for (int64_t r = 0; r < rows; r++)
                unpack_row(w + (n0 + r) * row_bytes, qtype, ng, nb, wt + r * K);
            if (rows < NR) memset(wt + rows * K, 0, sizeof(float) * (NR - rows) * K);
            if (next > 0) prefetch(w + (n0 + NR) * row_bytes, next * row_bytes);
            tile_rows(xt, wt, out, M, N, K, n0, rows);
        }
    }
    return failed ? -2 : 0;
}

// The rows the GEMM computes as one: a batch's rows are padded to a multiple of this (one
// vector of rows), so a step's matmuls cost the same from 17 to 32 rows. The scheduler fills the
// padding with prompt tokens (engine/step_cost.py).
int q_gemm_rows(void) { return VW; }

// Whether this build's kernels take packed rows of qtype: the vector builds, all three types.
int q_takes_packed(int64_t qtype) {
    return GEMV_ROWS > 0 && block_bytes(qtype) != 0;
}

// x (M, K) float32 contiguous, w (N, K / 32 blocks) of qtype, | Q_PACKED for packed rows (see
// q_takes_packed), out (M, N) float32. Returns 0, -1 for an unknown qtype, packed rows this
// build does not take or K not a multiple of 32, -2 without memory.
int q_linear(const float *x, const uint8_t *w, float *out, int64_t M, int64_t N, int64_t K,
             int64_t qtype) {
    int64_t base = qtype;
    if ((take_packed(&base) && !q_takes_packed(base)) || block_bytes(base) == 0 || K % QK != 0 ||
        M < 1 || N < 1)
        return -1;
    return M < GEMV_ROWS ? quant_gemv(x, w, out, M, N, K, qtype) : gemm(x, w, out, M, N, K, qtype);
}

// The matrix as floats for a float GEMM (torch's, custom_ops.q_linear_mm): w (N, K / 32
// blocks) of qtype | Q_PACKED -> out (N, K), each row in lane order over its packed groups
// (quant_blocks.h), as q_lane_order puts x: the values gguf-py gives, the columns permuted.
int q_dequant(const uint8_t *w, float *out, int64_t N, int64_t K, int64_t qtype) {
    const int packed = take_packed(&qtype);
    if ((packed && !q_takes_packed(qtype)) || block_bytes(qtype) == 0 || K % QK != 0) return -1;
    const int64_t nb = K / QK, row_bytes = nb * block_bytes(qtype), ng = packed ? nb / GROUP : 0;
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) unpack_row(w + n * row_bytes, qtype, ng, nb, out + n * K);
    return 0;
}

// x (M, K) -> out (M, K), each row in the lane order of a packed matrix of width K (identity
// where qtype has no Q_PACKED): x @ q_dequant(w)^T is then x @ W^T.
int q_lane_order(const float *x, float *out, int64_t M, int64_t K, int64_t qtype) {
    const int packed = take_packed(&qtype);
    if (K % QK != 0) return -1;
    const int64_t ng = packed ? K / QK / GROUP : 0;
    for (int64_t m = 0; m < M; m++) to_lane_order(x + m * K, K, ng, out + m * K, 1);
    return 0;
}

// One row of nb blocks into the packed layout (quant_blocks.h).
static void repack_row(const uint8_t *src, uint8_t *dst, int64_t qtype, int64_t nb) {
    const int bs = block_bytes(qtype), sb = scale_bytes(qtype), qb = quant_bytes(qtype);
    const int64_t ng = nb / GROUP;
    for (int64_t g = 0; g < ng; g++, dst += GROUP * bs) {
        for (int j = 0; j < GROUP; j++) {
            const uint8_t *blk = src + (g * GROUP + j) * bs;
            for (int s = 0; s < sb; s += 2) memcpy(dst + s * GROUP + 2 * j, blk + s, 2);
            for (int i = 0; i < qb; i++) dst[GROUP * sb + i * GROUP + j] = blk[sb + i];
        }
    }
    memcpy(dst, src + ng * GROUP * bs, (nb - ng * GROUP) * bs);
}

// src (N, K / 32 blocks) of qtype -> dst, the same bytes packed. Returns 0, or -1 for an
// unknown qtype, K not a multiple of 32 or dst overlapping src.
int q_repack(const uint8_t *src, uint8_t *dst, int64_t N, int64_t K, int64_t qtype) {
    const int64_t row_bytes = K / QK * block_bytes(qtype);
    if (block_bytes(qtype) == 0 || K % QK != 0 || N < 0 ||
        (dst < src + N * row_bytes && src < dst + N * row_bytes))
        return -1;
    for (int64_t n = 0; n < N; n++)
        repack_row(src + n * row_bytes, dst + n * row_bytes, qtype, K / QK);
    return 0;
}
