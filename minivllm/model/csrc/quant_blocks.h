// The ggml blocks that quant_ops.c (the GEMM, q_linear) and quant_gemv.c (the GEMV) read.
//
// Block layouts (ggml-common.h; gguf-py's quants.py reads the same):
//   Q4_0 (18 bytes): fp16 d, 16 bytes of nibbles; w = d * (q - 8)
//   Q4_1 (20 bytes): fp16 d, fp16 m, 16 bytes of nibbles; w = d * q + m
//   Q8_0 (34 bytes): fp16 d, 32 int8; w = d * q
// Nibble j of a block (j < 16) is the low half of byte j, weight j + 16 its high half. All
// three are w = d q + m, m being -8 d for Q4_0 and 0 for Q8_0: one fused multiply-add, which
// for Q4_0 and Q8_0 rounds to exactly gguf-py's values.
//
// Packed rows (q_repack makes them at load, quant_linear.py): a row's blocks in groups of
// GROUP, each group its GROUP d's (fp16), then for Q4_1 its GROUP m's, then a row of GROUP
// bytes for each quant byte of a block (16 for Q4, 32 for Q8_0), row i holding byte i of each
// block (lane j: block j). The blocks past the last whole group stay as they are. Same bytes
// as the row in the file; a group is 288 (Q4_0), 320 (Q4_1) or 544 (Q8_0) bytes. Kernels take
// them with qtype | Q_PACKED. In a group, weight t of block j sits at "lane order" position
// t * GROUP + j (Q4: byte i's low nibble is weight i, its high one i + 16; Q8_0: byte t is
// weight t), where the kernels put x's k too (to_lane_order).
#ifndef QUANT_BLOCKS_H
#define QUANT_BLOCKS_H
#include <stdint.h>
#include <string.h>
#if defined(__F16C__) || defined(__AVX2__)
#include <immintrin.h>
#endif

enum { QK = 32, GROUP = 16 };
enum { GGML_Q4_0 = 2, GGML_Q4_1 = 3, GGML_Q8_0 = 8 };  // GGMLQuantizationType values
enum { Q_PACKED = 0x100 };  // flag on a qtype: the rows are packed (above)

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

// Takes Q_PACKED off *qtype: whether the rows are packed.
static inline int take_packed(int64_t *qtype) {
    const int packed = (*qtype & Q_PACKED) != 0;
    *qtype &= ~(int64_t)Q_PACKED;
    return packed;
}

static inline int block_bytes(int64_t qtype) {
    return qtype == GGML_Q4_0 ? 18 : qtype == GGML_Q4_1 ? 20 : qtype == GGML_Q8_0 ? 34 : 0;
}

static inline int scale_bytes(int64_t qtype) {  // d, and m for Q4_1, ahead of the quants
    return qtype == GGML_Q4_1 ? 4 : 2;
}

static inline int quant_bytes(int64_t qtype) {  // a block's bytes of quants, after d (and m)
    return block_bytes(qtype) - scale_bytes(qtype);
}

// m of w = d q + m for a block whose scale is d.
static inline float block_min(const uint8_t *blk, int64_t qtype, float d) {
    return qtype == GGML_Q4_1 ? half_to_float(blk + 2) : qtype == GGML_Q4_0 ? -8.f * d : 0.f;
}

// One row of x (K floats) into dst[p * stride], p in lane order over the first ng groups
// (x's weight t of block j of a group at t * GROUP + j), as it is past them. The writes run in
// order: a stride of GROUP positions would pile them into a few cache sets.
static inline void to_lane_order(const float *x, int64_t K, int64_t ng, float *dst,
                                 int64_t stride) {
    for (int64_t g = 0; g < ng; g++, x += GROUP * QK, dst += GROUP * QK * stride)
        for (int t = 0; t < QK; t++)
            for (int j = 0; j < GROUP; j++) dst[(t * GROUP + j) * stride] = x[j * QK + t];
    for (int64_t k = 0; k < K - ng * GROUP * QK; k++) dst[k * stride] = x[k];
}

#if defined(__AVX512F__) || defined(__AVX2__)
// A block's 32 quants as bytes: weights 0-15 in lo, 16-31 in hi (signed for Q8_0).
static inline void block_quants(const uint8_t *blk, int64_t qtype, __m128i *lo, __m128i *hi) {
    if (qtype == GGML_Q8_0) {
        *lo = _mm_loadu_si128((const __m128i *)(blk + 2));
        *hi = _mm_loadu_si128((const __m128i *)(blk + 18));
    } else {
        const __m128i low4 = _mm_set1_epi8(0xf);
        const __m128i q = _mm_loadu_si128((const __m128i *)(blk + scale_bytes(qtype)));
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

// LANES floats or int32s a vector, and the few operations the packed kernels need on them.
#if defined(__AVX512F__)
enum { LANES = 16 };
typedef __m512 fvec;
typedef __m512i ivec;
static inline ivec widen_u8(const uint8_t *p) {  // LANES bytes -> int32s
    return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
}
static inline fvec widen_i8(const uint8_t *p) {  // LANES signed bytes (Q8_0) -> floats
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}
static inline fvec load_halves(const uint8_t *p) {  // LANES fp16 -> floats
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}
static inline fvec low_nibbles(ivec v) {
    return _mm512_cvtepi32_ps(_mm512_and_si512(v, _mm512_set1_epi32(0xf)));
}
static inline fvec high_nibbles(ivec v) { return _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4)); }
static inline fvec loadf(const float *p) { return _mm512_loadu_ps(p); }
static inline fvec fmadd(fvec a, fvec b, fvec c) { return _mm512_fmadd_ps(a, b, c); }
#elif defined(__AVX2__)
enum { LANES = 8 };
typedef __m256 fvec;
typedef __m256i ivec;
static inline ivec widen_u8(const uint8_t *p) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
}
static inline fvec widen_i8(const uint8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}
static inline fvec load_halves(const uint8_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}
static inline fvec low_nibbles(ivec v) {
    return _mm256_cvtepi32_ps(_mm256_and_si256(v, _mm256_set1_epi32(0xf)));
}
static inline fvec high_nibbles(ivec v) { return _mm256_cvtepi32_ps(_mm256_srli_epi32(v, 4)); }
static inline fvec loadf(const float *p) { return _mm256_loadu_ps(p); }
static inline fvec fmadd(fvec a, fvec b, fvec c) { return _mm256_fmadd_ps(a, b, c); }
#endif

#if defined(__AVX512F__) || defined(__AVX2__)
enum { GEMV_ROWS = 6 };  // batches below this take the GEMV (from 6 rows the GEMM was faster)
#else
enum { GEMV_ROWS = 0 };  // no vector GEMV in a build without AVX2: the GEMM serves every batch
#endif

// quant_gemv.c: out (M, N) = x (M, K) W^T for M < GEMV_ROWS; qtype may carry Q_PACKED.
int quant_gemv(const float *x, const uint8_t *w, float *out, int64_t M, int64_t N, int64_t K,
               int64_t qtype);
#endif
