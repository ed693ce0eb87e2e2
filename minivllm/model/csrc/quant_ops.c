// Linear layers on a GGUF's own quantized blocks: y = x @ W^T for float32 activations x (M, K)
// and W (N, K) stored as ggml blocks of 32 weights, dequantized inside the kernel.
//
// Block layouts (ggml-common.h; gguf-py's quants.py reads the same):
//   Q4_0 (18 bytes): fp16 d, 16 bytes of nibbles; w = d * (q - 8)
//   Q4_1 (20 bytes): fp16 d, fp16 m, 16 bytes of nibbles; w = d * q + m
//   Q8_0 (34 bytes): fp16 d, 32 int8; w = d * q
// Nibble j of a block (j < 16) is the low half of byte j, weight j + 16 its high half.
//
// Each thread takes a range of output rows, TILE rows at a time: it unpacks the tile's blocks
// once into a float buffer (TILE * K floats, in L1/L2), then every row of x (the whole batch)
// is dotted against it, TILE outputs per pass over x. At batch 1 this is the GEMV (the bytes
// read are the blocks: 5 bits a weight for Q4_1 instead of 32); at batch 32 each block is
// unpacked once for all 32 rows. The loops are plain C written to vectorise: gcc emits AVX-512
// for -march=native on a CPU with it and AVX2 for -march=x86-64-v3 (csrc_build.py).
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__F16C__)
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

// x (M, K) float32 contiguous, w (N, K / 32 blocks) of qtype, out (M, N) float32.
// Returns 0, -1 for an unknown qtype or K not a multiple of 32, -2 without memory.
int q_linear(const float *x, const uint8_t *w, float *out, int64_t M, int64_t N, int64_t K,
             int64_t qtype) {
    const int bs = block_bytes(qtype);
    if (bs == 0 || K % QK != 0 || M < 1 || N < 1) return -1;
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
