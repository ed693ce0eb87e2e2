// Linear layers on a GGUF's own quantized blocks: y = x @ W^T for float32 activations x (M, K)
// and W (N, K) stored as ggml blocks of 32 weights, dequantized inside the kernel.
//
// Block layouts (ggml-common.h; gguf-py's quants.py reads the same):
//   Q4_0 (18 bytes): fp16 d, 16 bytes of nibbles; w = d * (q - 8)
//   Q4_1 (20 bytes): fp16 d, fp16 m, 16 bytes of nibbles; w = d * q + m
//   Q8_0 (34 bytes): fp16 d, 32 int8; w = d * q
// Nibble j of a block (j < 16) is the low half of byte j, weight j + 16 its high half. All
// three are w = d q + m, m being -8 d for Q4_0 and 0 for Q8_0: one fused multiply-add, which
// for Q4_0 and Q8_0 rounds to exactly gguf-py's values.
//
// Batches of 1-5 rows (decode at batch 1): the GEMV, each block from memory into registers.
// The bytes read are the blocks: 5 bits a weight for Q4_1.
// Larger batches: the GEMM, which unpacks each block once into a small float panel and runs
// every row of the batch against it with a register-blocked micro-kernel (see gemm below).
// Both use AVX-512 or AVX2 intrinsics, whichever the build's -march has (csrc_build.py:
// native, or x86-64-v3 for AVX2 only); a build with neither runs the GEMM on plain C.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__F16C__) || defined(__AVX2__)
#include <immintrin.h>
#endif

enum { QK = 32 };
enum { GGML_Q4_0 = 2, GGML_Q4_1 = 3, GGML_Q8_0 = 8 };  // GGMLQuantizationType values

static inline float half_to_float(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp == 0) {  // zero or subnormal: renormalise
        if (man == 0) {
            bits = sign;
        } else {
            int e = -1;
            do { man <<= 1; e++; } while (!(man & 0x400));
            bits = sign | (uint32_t)(112 - e) << 23 | (man & 0x3ff) << 13;
        }
    } else {
        bits = sign | (exp + 112) << 23 | man << 13;
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
#endif
}

static inline int block_bytes(int64_t qtype) {
    return qtype == GGML_Q4_0 ? 18 : qtype == GGML_Q4_1 ? 20 : qtype == GGML_Q8_0 ? 34 : 0;
}

// m of w = d q + m for a block whose scale is d.
static inline float block_min(const uint8_t *blk, int64_t qtype, float d) {
    return qtype == GGML_Q4_1 ? half_to_float(blk + 2) : qtype == GGML_Q4_0 ? -8.f * d : 0.f;
}

#if defined(__AVX512F__) || defined(__AVX2__)
// A block's 32 quants as bytes: weights 0-15 in lo, 16-31 in hi (signed for Q8_0).
static inline void block_quants(const uint8_t *blk, int64_t qtype, __m128i *lo, __m128i *hi) {
    if (qtype == GGML_Q8_0) {
        *lo = _mm_loadu_si128((const __m128i *)(blk + 2));
        *hi = _mm_loadu_si128((const __m128i *)(blk + 18));
    } else {
        const __m128i low4 = _mm_set1_epi8(0xf);
        const __m128i q = _mm_loadu_si128((const __m128i *)(blk + (qtype == GGML_Q4_1 ? 4 : 2)));
        *lo = _mm_and_si128(q, low4);
        *hi = _mm_and_si128(_mm_srli_epi16(q, 4), low4);
    }
}
#endif

#if defined(__AVX512F__)
static inline __m512 widen16(__m128i q, int64_t qtype) {  // 16 quant bytes -> 16 floats
    return _mm512_cvtepi32_ps(qtype == GGML_Q8_0 ? _mm512_cvtepi8_epi32(q)
                                                 : _mm512_cvtepu8_epi32(q));
}
#elif defined(__AVX2__)
static inline __m256 widen8(__m128i q, int64_t qtype) {  // the low 8 quant bytes -> 8 floats
    return _mm256_cvtepi32_ps(qtype == GGML_Q8_0 ? _mm256_cvtepi8_epi32(q)
                                                 : _mm256_cvtepu8_epi32(q));
}
#endif

// One row of nb blocks -> nb * 32 floats, the values gguf-py's dequantize gives.
static void unpack_row(const uint8_t *src, int64_t qtype, int64_t nb, float *restrict w) {
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
            const uint8_t *q = blk + (qtype == GGML_Q4_1 ? 4 : 2);
            const int v = qtype == GGML_Q8_0 ? (int8_t)q[j] : (q[j % 16] >> (j / 16 * 4)) & 0xf;
            w[j] = (float)v * d + m;
        }
#endif
    }
}

// The GEMV (batch 1-5): each block straight from memory into vector registers, no buffer.
// sum_j (d q_j + m) x_j = d (q . x) + m sum(x): one multiply-add by d per block, and the
// block sums of x computed once. A block's d and m (two fp16) become floats in one
// conversion, and its m sum(x) goes into a 2-lane accumulator against the pair (-8 sum(x), 0)
// for Q4_0 or (0, sum(x)) for Q4_1 (Q8_0: (0, 0)), so no scalar work is left per block. On Zen 4
// this took a Q4_1 row from 5.7 to 4.7 cycles a block: the loop is bound by its vector ops.
#if defined(__AVX512F__) || defined(__AVX2__)
static inline __m128 block_dm(const uint8_t *blk, int64_t qtype) {  // (d, m or 0, 0, 0)
    uint32_t bits = 0;
    memcpy(&bits, blk, qtype == GGML_Q4_1 ? 4 : 2);
    return _mm_cvtph_ps(_mm_cvtsi32_si128((int)bits));
}

static inline __attribute__((always_inline)) float row_dot(
        const uint8_t *row, int64_t qtype, int64_t nb, const float *x, const float *pairs) {
    const int bs = block_bytes(qtype);
    __m128 am = _mm_setzero_ps();
#if defined(__AVX512F__)
    __m512 acc = _mm512_setzero_ps();
#else
    __m256 acc = _mm256_setzero_ps();
#endif
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = row + b * bs;
        const float *xb = x + b * QK;
        const __m128 dm = block_dm(blk, qtype);
        am = _mm_fmadd_ps(dm, _mm_castsi128_ps(_mm_loadl_epi64((const __m128i *)(pairs + 2 * b))),
                          am);
#if defined(__AVX512F__)
        __m512 lo, hi;
        if (qtype == GGML_Q8_0) {
            lo = widen16(_mm_loadu_si128((const __m128i *)(blk + 2)), qtype);
            hi = widen16(_mm_loadu_si128((const __m128i *)(blk + 18)), qtype);
        } else {  // both nibbles of a byte from one zero-extension
            const __m512i v = _mm512_cvtepu8_epi32(
                _mm_loadu_si128((const __m128i *)(blk + (qtype == GGML_Q4_1 ? 4 : 2))));
            lo = _mm512_cvtepi32_ps(_mm512_and_si512(v, _mm512_set1_epi32(0xf)));
            hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4));
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

enum { GEMV_ROWS = 6 };  // batches below this take the GEMV (from 6 rows the GEMM was faster)

// Rows n of out for one row of x, with the row_dot specialised for qtype.
#define GEMV_LOOP(QT)                                                                        \
    _Pragma("omp for schedule(static)")                                                      \
    for (int64_t n = 0; n < N; n++)                                                          \
        for (int64_t m = 0; m < M; m++)                                                      \
            out[m * N + n] = row_dot(w + n * row_bytes, QT, nb, x + m * K, pairs + m * 2 * nb)

static int gemv(const float *x, const uint8_t *w, float *out, int64_t M, int64_t N, int64_t K,
                int64_t qtype) {
    const int64_t nb = K / QK, row_bytes = nb * block_bytes(qtype);
    float *pairs = malloc(sizeof(float) * 2 * M * nb);  // per block: m's partner, see above
    if (pairs == NULL) return -2;
    for (int64_t i = 0; i < M * nb; i++) {
        float s = 0.f;
        for (int j = 0; j < QK; j++) s += x[i * QK + j];
        pairs[2 * i] = qtype == GGML_Q4_0 ? -8.f * s : 0.f;
        pairs[2 * i + 1] = qtype == GGML_Q4_1 ? s : 0.f;
    }
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
enum { GEMV_ROWS = 0 };  // no vector GEMV in a build without AVX2: the GEMM serves every batch
static int gemv(const float *x, const uint8_t *w, float *out, int64_t M, int64_t N, int64_t K,
                int64_t qtype) {
    return -1;
}
#endif

// The batched GEMM (batch 6 and up): out^T = W x^T. Each thread takes NR output rows at a
// time, unpacks their blocks once (NR * K floats, in L1/L2) and runs them against every chunk
// of rows of x, which is transposed once per call into (K, chunk) panels. The micro-kernel
// holds NR x 2 vectors of sums in registers; per k it loads two vectors of x and broadcasts
// each row's one weight: 2 NR multiply-adds for NR + 2 loads, so it is bound by arithmetic.
// A last chunk of one vector's rows or fewer runs on one vector (half the padding).
#if defined(__AVX512F__)
enum { VW = 16, NR = 12 };  // 24 of the 32 zmm registers hold sums
#elif defined(__AVX2__)
enum { VW = 8, NR = 6 };  // 12 of the 16 ymm registers
#else
enum { VW = 4, NR = 6 };  // 128-bit vectors (SSE, NEON): 12 registers
#endif
enum { MC = 2 * VW, KC = 128 };  // rows of x per chunk; k per pass (wt and xt's share in L1)
typedef float vf __attribute__((vector_size(VW * 4)));

// res[r][l] (+)= sum over k0 <= k < k1 of wt[r][k] xt[k][l], for l < nv * VW: output row r,
// row l of the chunk (res's rows are MC apart).
static inline __attribute__((always_inline)) void micro_kernel(
        const float *restrict xt, const float *restrict wt, int64_t K, int64_t k0, int64_t k1,
        float *restrict res, const int nv) {
    vf acc[NR][2];
    if (k0 == 0) memset(acc, 0, sizeof(acc));
    else memcpy(acc, res, sizeof(acc));
    for (int64_t k = k0; k < k1; k++) {
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

// A buffer of at least n floats, kept by the calling thread for its next call: a fresh one per
// call would be mapped and faulted in each time (xt passes malloc's mmap threshold at K 1536).
static float *scratch(int which, int64_t n) {
    static __thread float *buf[2];
    static __thread int64_t cap[2];
    if (n > cap[which]) {
        free(buf[which]);
        buf[which] = aligned_alloc(64, sizeof(float) * ((n + 15) / 16 * 16));  // 64-byte lines
        cap[which] = buf[which] == NULL ? 0 : n;
    }
    return buf[which];
}

// x's chunks, each (K, chunk rows) from xt + m0 * K, zero past row M.
static float *transpose_chunks(const float *x, int64_t M, int64_t K) {
    float *xt = scratch(0, K * ((M + MC - 1) / MC * MC));
    if (xt == NULL) return NULL;
    for (int64_t m0 = 0; m0 < M; m0 += chunk_rows(M, m0)) {
        const int64_t rows = chunk_rows(M, m0);
        for (int64_t l = 0; l < rows; l++)
            for (int64_t k = 0; k < K; k++)
                xt[m0 * K + k * rows + l] = m0 + l < M ? x[(m0 + l) * K + k] : 0.f;
    }
    return xt;
}

// Output rows n0 .. n0 + rows (unpacked in wt) for every row of x.
static void tile_rows(const float *xt, const float *wt, float *out, int64_t M, int64_t N,
                      int64_t K, int64_t n0, int64_t rows) {
    float res[NR * MC];
    for (int64_t m0 = 0; m0 < M; m0 += chunk_rows(M, m0)) {
        const int64_t width = chunk_rows(M, m0);
        for (int64_t k0 = 0; k0 < K; k0 += KC) {
            const int64_t k1 = k0 + KC < K ? k0 + KC : K;
            if (width == MC) micro_kernel(xt + m0 * K, wt, K, k0, k1, res, 2);
            else micro_kernel(xt + m0 * K, wt, K, k0, k1, res, 1);
        }
        for (int64_t l = 0; l < width && m0 + l < M; l++)
            for (int64_t r = 0; r < rows; r++) out[(m0 + l) * N + n0 + r] = res[r * MC + l];
    }
}

static int gemm(const float *x, const uint8_t *w, float *out, int64_t M, int64_t N, int64_t K,
                int64_t qtype) {
    const int64_t nb = K / QK, row_bytes = nb * block_bytes(qtype), tiles = (N + NR - 1) / NR;
    float *xt = transpose_chunks(x, M, K);
    if (xt == NULL) return -2;
    int failed = 0;
#pragma omp parallel
    {
        float *wt = scratch(1, NR * K);
        if (wt == NULL) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t t = 0; t < tiles; t++) {
            if (wt == NULL) continue;
            const int64_t n0 = t * NR, rows = N - n0 < NR ? N - n0 : NR;
            for (int64_t r = 0; r < rows; r++)
                unpack_row(w + (n0 + r) * row_bytes, qtype, nb, wt + r * K);
            if (rows < NR) memset(wt + rows * K, 0, sizeof(float) * (NR - rows) * K);
            tile_rows(xt, wt, out, M, N, K, n0, rows);
        }
    }
    return failed ? -2 : 0;
}

// x (M, K) float32 contiguous, w (N, K / 32 blocks) of qtype, out (M, N) float32.
// Returns 0, -1 for an unknown qtype or K not a multiple of 32, -2 without memory.
int q_linear(const float *x, const uint8_t *w, float *out, int64_t M, int64_t N, int64_t K,
             int64_t qtype) {
    if (block_bytes(qtype) == 0 || K % QK != 0 || M < 1 || N < 1) return -1;
    return M < GEMV_ROWS ? gemv(x, w, out, M, N, K, qtype) : gemm(x, w, out, M, N, K, qtype);
}
