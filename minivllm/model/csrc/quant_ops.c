// Linear layers on a GGUF's own quantized blocks: y = x @ W^T for float32 activations x (M, K)
// and W (N, K) stored as ggml blocks of 32 weights, dequantized inside the kernel.
//
// Block layouts (ggml-common.h; gguf-py's quants.py reads the same):
//   Q4_0 (18 bytes): fp16 d, 16 bytes of nibbles; w = d * (q - 8)
//   Q4_1 (20 bytes): fp16 d, fp16 m, 16 bytes of nibbles; w = d * q + m
//   Q8_0 (34 bytes): fp16 d, 32 int8; w = d * q
// Nibble j of a block (j < 16) is the low half of byte j, weight j + 16 its high half.
//
// Batches of 1-3 rows (decode at batch 1): the GEMV, each block from memory into registers,
// with AVX-512 or AVX2 intrinsics, whichever the build's -march has (csrc_build.py: native,
// or x86-64-v3 for AVX2 only). The bytes read are the blocks: 5 bits a weight for Q4_1.
// Larger batches: each thread takes a range of output rows, TILE rows at a time; it unpacks
// the tile's blocks once into a float buffer (TILE * K floats, in L1/L2), then every row of x
// (the whole batch) is dotted against it, 4 rows of x at once: each block is unpacked once for
// all rows of the batch. Those loops are plain C that gcc vectorises for the same -march.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__F16C__) || defined(__AVX2__)
#include <immintrin.h>
#endif

enum { QK = 32, TILE = 4 };
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

// One row of nb blocks -> nb * 32 floats, the same values gguf-py's dequantize gives.
static void unpack_row(const uint8_t *src, int64_t qtype, int64_t nb, float *restrict w) {
    for (int64_t b = 0; b < nb; b++, w += QK) {
        if (qtype == GGML_Q8_0) {
            const uint8_t *blk = src + b * 34;
            const float d = half_to_float(blk);
            const int8_t *q = (const int8_t *)(blk + 2);
            for (int j = 0; j < QK; j++) w[j] = (float)q[j] * d;
        } else if (qtype == GGML_Q4_1) {
            const uint8_t *blk = src + b * 20;
            const float d = half_to_float(blk), m = half_to_float(blk + 2);
            const uint8_t *q = blk + 4;
            for (int j = 0; j < QK / 2; j++) {
                w[j] = d * (float)(q[j] & 0xf) + m;
                w[j + QK / 2] = d * (float)(q[j] >> 4) + m;
            }
        } else {
            const uint8_t *blk = src + b * 18;
            const float d = half_to_float(blk);
            const uint8_t *q = blk + 2;
            for (int j = 0; j < QK / 2; j++) {
                w[j] = d * (float)((int)(q[j] & 0xf) - 8);
                w[j + QK / 2] = d * (float)((int)(q[j] >> 4) - 8);
            }
        }
    }
}

// out[m .. m + 4, n0 .. n0 + 4): 4 rows of x against 4 unpacked weight rows, 16 sums held at
// once (8 loads for 16 multiply-adds: the batched case is bound by arithmetic, not loads).
static void dot_4x4(const float *restrict x, const float *restrict wt, float *restrict out,
                    int64_t N, int64_t K) {
    const float *x0 = x, *x1 = x + K, *x2 = x + 2 * K, *x3 = x + 3 * K;
    const float *w0 = wt, *w1 = wt + K, *w2 = wt + 2 * K, *w3 = wt + 3 * K;
    float s[4][4] = {{0.f}};
    for (int64_t k = 0; k < K; k++) {
        const float a[4] = {x0[k], x1[k], x2[k], x3[k]}, b[4] = {w0[k], w1[k], w2[k], w3[k]};
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 4; j++) s[i][j] += a[i] * b[j];
    }
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) out[i * N + j] = s[i][j];
}

// out[m, n0 .. n0 + rows) for every m: the tile's unpacked rows wt (rows, K) against x (M, K).
static void tile_dot(const float *restrict x, const float *restrict wt, float *restrict out,
                     int64_t M, int64_t N, int64_t K, int64_t n0, int rows) {
    int64_t m = 0;
    if (rows == TILE)
        for (; m + 4 <= M; m += 4) dot_4x4(x + m * K, wt, out + m * N + n0, N, K);
    for (; m < M; m++) {
        const float *xm = x + m * K;
        if (rows == TILE) {
            const float *w0 = wt, *w1 = wt + K, *w2 = wt + 2 * K, *w3 = wt + 3 * K;
            float s0 = 0.f, s1 = 0.f, s2 = 0.f, s3 = 0.f;
            for (int64_t k = 0; k < K; k++) {
                const float xv = xm[k];
                s0 += w0[k] * xv;
                s1 += w1[k] * xv;
                s2 += w2[k] * xv;
                s3 += w3[k] * xv;
            }
            float *o = out + m * N + n0;
            o[0] = s0, o[1] = s1, o[2] = s2, o[3] = s3;
        } else {
            for (int r = 0; r < rows; r++) {
                const float *wr = wt + r * K;
                float s = 0.f;
                for (int64_t k = 0; k < K; k++) s += wr[k] * xm[k];
                out[m * N + n0 + r] = s;
            }
        }
    }
}

// The GEMV (batch 1-3): each block straight from memory into vector registers, no buffer.
// sum_j (d q_j + m) x_j = d (q . x) + m sum(x): one multiply-add by d per block, and the
// block sums of x (xsum) computed once. Q4_0 is m = -8 d, Q8_0 m = 0 with signed quants.
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
static float row_dot(const uint8_t *row, int64_t qtype, int64_t nb, const float *x,
                     const float *xsum) {
    const int bs = block_bytes(qtype), off = qtype == GGML_Q4_1 ? 4 : 2;
    const __m128i low4 = _mm_set1_epi8(0xf);
    float mx = 0.f;
#if defined(__AVX512F__)
    __m512 acc = _mm512_setzero_ps();
#else
    __m256 acc = _mm256_setzero_ps();
#endif
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = row + b * bs;
        const float d = half_to_float(blk), *xb = x + b * QK;
        __m128i lo, hi;  // weights 0-15 and 16-31 as bytes
        if (qtype == GGML_Q8_0) {
            lo = _mm_loadu_si128((const __m128i *)(blk + 2));
            hi = _mm_loadu_si128((const __m128i *)(blk + 18));
        } else {
            const __m128i q = _mm_loadu_si128((const __m128i *)(blk + off));
            lo = _mm_and_si128(q, low4);
            hi = _mm_and_si128(_mm_srli_epi16(q, 4), low4);
        }
        mx += (qtype == GGML_Q4_1 ? half_to_float(blk + 2) : qtype == GGML_Q4_0 ? -8.f * d : 0.f)
              * xsum[b];
#if defined(__AVX512F__)
        __m512 wl, wh;
        if (qtype == GGML_Q8_0) {
            wl = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(lo));
            wh = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(hi));
        } else {
            wl = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(lo));
            wh = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(hi));
        }
        const __m512 t = _mm512_fmadd_ps(wh, _mm512_loadu_ps(xb + 16),
                                         _mm512_mul_ps(wl, _mm512_loadu_ps(xb)));
        acc = _mm512_fmadd_ps(_mm512_set1_ps(d), t, acc);
#else
        __m256 t = _mm256_setzero_ps();
        const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
        for (int i = 0; i < 4; i++) {
            const __m256i v = qtype == GGML_Q8_0 ? _mm256_cvtepi8_epi32(parts[i])
                                                 : _mm256_cvtepu8_epi32(parts[i]);
            t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), _mm256_loadu_ps(xb + 8 * i), t);
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), t, acc);
#endif
    }
#if defined(__AVX512F__)
    return _mm512_reduce_add_ps(acc) + mx;
#else
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s) + mx;
#endif
}

enum { GEMV_ROWS = 4 };  // batches below this take the GEMV

static int gemv(const float *x, const uint8_t *w, float *out, int64_t M, int64_t N, int64_t K,
                int64_t qtype) {
    const int64_t nb = K / QK, row_bytes = nb * block_bytes(qtype);
    float *xsum = malloc(sizeof(float) * M * nb);
    if (xsum == NULL) return -2;
    for (int64_t i = 0; i < M * nb; i++) {
        float s = 0.f;
        for (int j = 0; j < QK; j++) s += x[i * QK + j];
        xsum[i] = s;
    }
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++)
        for (int64_t m = 0; m < M; m++)
            out[m * N + n] = row_dot(w + n * row_bytes, qtype, nb, x + m * K, xsum + m * nb);
    free(xsum);
    return 0;
}
#else
enum { GEMV_ROWS = 0 };  // no vector GEMV in a build without AVX2: the tiles serve every batch
static int gemv(const float *x, const uint8_t *w, float *out, int64_t M, int64_t N, int64_t K,
                int64_t qtype) {
    return -1;
}
#endif

// x (M, K) float32 contiguous, w (N, K / 32 blocks) of qtype, out (M, N) float32.
// Returns 0, -1 for an unknown qtype or K not a multiple of 32, -2 without memory.
int q_linear(const float *x, const uint8_t *w, float *out, int64_t M, int64_t N, int64_t K,
             int64_t qtype) {
    const int bs = block_bytes(qtype);
    if (bs == 0 || K % QK != 0 || M < 1 || N < 1) return -1;
    if (M < GEMV_ROWS) return gemv(x, w, out, M, N, K, qtype);
    const int64_t nb = K / QK, row_bytes = nb * bs, tiles = (N + TILE - 1) / TILE;
    int failed = 0;
#pragma omp parallel
    {
        float *wt = malloc(sizeof(float) * TILE * K);
        if (wt == NULL) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t t = 0; t < tiles; t++) {
            if (wt == NULL) continue;
            const int64_t n0 = t * TILE;
            const int rows = (int)(N - n0 < TILE ? N - n0 : TILE);
            for (int r = 0; r < rows; r++)
                unpack_row(w + (n0 + r) * row_bytes, qtype, nb, wt + r * K);
            tile_dot(x, wt, out, M, N, K, n0, rows);
        }
        free(wt);
    }
    return failed ? -2 : 0;
}
