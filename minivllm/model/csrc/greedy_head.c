// Greedy tokens from a Q8_0 output head without the full float32 logits: screen every token
// with integer dot products, then compute exactly only the tokens the screen cannot rule out.
//
// A greedy step needs the argmax of the logits, not the logits. x (one row per sequence) is
// rounded to int8, with a scale s_b per block of 32 columns (one outlier channel, which the
// model's final norm has, then blurs only its own block), and meets each vocabulary row's Q8_0
// quants (int8, a float scale per block) in AVX-512 VNNI's u8 x s8 dot products: four times the
// multiply-adds of a float32 FMA per instruction. Rounding moves x_k by at most s_b / 2, so the
// approximate logit a_n is within E_n = sum_b (s_b / 2) |w_nb|_1 (plus float slack) of the
// exact one, and the argmax is among the tokens with a_n + E_n >= max over j of (a_j - E_j).
// Only those (a few dozen of 49,152) are computed in float32 from the same weights: the result
// is the argmax of float32 logits, not a cheaper model's. Where the screen is not built (no
// VNNI) or declines a row, the caller computes the logits.
//
// The screen's copy of the weights (greedy_head.py builds it at load): tiles of 16 vocabulary
// rows; per block of 32 columns, 8 quads of 64 bytes (16 rows x 4 consecutive quants, each
// stored + 128 as an unsigned byte), the 16 rows' block scales and their |w_nb|_1 as floats.
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "quant_blocks.h"
#include "thread_scratch.h"

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#include <immintrin.h>
#include <omp.h>

enum { TILE = 16, QUADS = QK / 4, MB = 8 };  // MB rows of x share a tile's weights
#define SLACK 0.52f  // E_n = SLACK * sum_b s_b |w_nb|_1: 0.5 for the rounding, 0.02 for float error

// x row m -> q (K int8) with q * s_b ~ x in block b, s (K / 32 scales) and the block sums of q
// (to take back the + 128 on the weights); 0 where x is not finite.
static int quantize_row(const float *x, int64_t K, int8_t *q, int32_t *bsum, float *s) {
    for (int64_t b = 0; b < K / QK; b++, x += QK, q += QK) {
        float amax = 0.f;
        for (int k = 0; k < QK; k++) {
            uint32_t bits;
            memcpy(&bits, x + k, 4);
            if ((bits & 0x7f800000u) == 0x7f800000u) return 0;  // -ffast-math hides isfinite
            amax = fmaxf(amax, fabsf(x[k]));
        }
        const float inv = amax > 0.f ? 127.f / amax : 0.f;
        int32_t sum = 0;
        for (int k = 0; k < QK; k++) sum += q[k] = (int8_t)lrintf(x[k] * inv);
        s[b] = amax / 127.f, bsum[b] = sum;
    }
    return 1;
}

// Rows m0 .. m0 + rows of x against tile t: the bounds of the tile's 16 logits, lo[i], hi[i].
static inline __attribute__((always_inline)) void screen_tile(
        const int8_t *xq, const int32_t *bsum, const float *s, int64_t m0, int rows, int64_t K,
        const uint8_t *wq, const float *wd, const float *wl1, int64_t t, __m512 *lo, __m512 *hi) {
    const int64_t nb = K / QK;
    __m512 facc[MB];
    for (int i = 0; i < MB; i++) facc[i] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *w = wq + (t * nb + b) * QUADS * 64;
        __m512i iacc[MB];
        for (int i = 0; i < rows; i++)  // the + 128 on the weights, taken back: -128 sum(q_x)
            iacc[i] = _mm512_set1_epi32(-128 * bsum[(m0 + i) * nb + b]);
        for (int u = 0; u < QUADS; u++) {
            const __m512i wv = _mm512_loadu_si512(w + u * 64);
#pragma GCC unroll 8
            for (int i = 0; i < rows; i++) {
                int32_t quad;
                memcpy(&quad, xq + (m0 + i) * K + b * QK + 4 * u, 4);
                iacc[i] = _mm512_dpbusd_epi32(iacc[i], wv, _mm512_set1_epi32(quad));
            }
        }
        const __m512 d = _mm512_loadu_ps(wd + (t * nb + b) * TILE);
        for (int i = 0; i < rows; i++)
            facc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(iacc[i]),
                                      _mm512_mul_ps(d, _mm512_set1_ps(s[(m0 + i) * nb + b])),
                                      facc[i]);
    }
    for (int i = 0; i < rows; i++) {
        __m512 e = _mm512_setzero_ps();
        for (int64_t b = 0; b < nb; b++)
            e = _mm512_fmadd_ps(_mm512_loadu_ps(wl1 + (t * nb + b) * TILE),
                                _mm512_set1_ps(s[(m0 + i) * nb + b]), e);
        e = _mm512_mul_ps(e, _mm512_set1_ps(SLACK));
        lo[i] = _mm512_sub_ps(facc[i], e);
        hi[i] = _mm512_add_ps(facc[i], e);
    }
}

// A thread's candidates for each row of x: the tokens whose upper bound reached the row's
// floor, the highest lower bound any thread had seen when their tile ran (it only rises, so
// none passed over can win). CAP a row, those the floor has since passed dropped when it
// fills; a row past it makes the call give up (-4: x all zeros, say).
enum { CAP = 1024 };
typedef struct {
    float hi[CAP];
    int32_t n[CAP], count;
} Candidates;

// The row's floor, shared by the threads: raised to at least f (a compare-and-swap loop).
static inline float raise_floor(float *floor_, float f) {
    float seen;
    uint32_t old = __atomic_load_n((uint32_t *)floor_, __ATOMIC_RELAXED), want;
    for (;;) {
        memcpy(&seen, &old, 4);
        if (seen >= f) return seen;
        memcpy(&want, &f, 4);
        if (__atomic_compare_exchange_n((uint32_t *)floor_, &old, want, 0, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED))
            return f;
    }
}

// Drops the candidates the floor has risen past since they came; 0 if none goes.
static int compact(Candidates *c, float floor_) {
    int kept = 0;
    for (int j = 0; j < c->count; j++)
        if (c->hi[j] >= floor_) c->hi[kept] = c->hi[j], c->n[kept++] = c->n[j];
    const int freed = kept < c->count;
    c->count = kept;
    return freed;
}

// Tile t's bounds for a row into its candidates (lanes past N masked off); 0 on overflow.
static inline int keep(Candidates *c, float *floor_, __m512 lo, __m512 hi, int64_t t,
                       int64_t N) {
    const int64_t left = N - t * TILE;
    const __mmask16 valid = left >= TILE ? 0xffff : (__mmask16)((1u << left) - 1);
    const float f = raise_floor(floor_, _mm512_mask_reduce_max_ps(valid, lo));
    __mmask16 pass = _mm512_mask_cmp_ps_mask(valid, hi, _mm512_set1_ps(f), _CMP_GE_OQ);
    if (!pass) return 1;
    float his[TILE];
    _mm512_storeu_ps(his, hi);
    for (; pass; pass &= pass - 1) {
        if (c->count == CAP && !compact(c, raise_floor(floor_, f))) return 0;
        const int lane = __builtin_ctz(pass);
        c->hi[c->count] = his[lane], c->n[c->count++] = (int32_t)(t * TILE + lane);
    }
    return 1;
}

// The float32 logit of vocabulary row n: x . (d_b * q) over the blocks, in column order.
static float exact_logit(const float *x, int64_t K, const uint8_t *wq, const float *wd,
                         int64_t n) {
    const int64_t nb = K / QK, t = n / TILE, r = n % TILE;
    float sum = 0.f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *w = wq + (t * nb + b) * QUADS * 64 + r * 4;
        const float d = wd[(t * nb + b) * TILE + r];
        for (int k = 0; k < QK; k++)
            sum = fmaf(x[b * QK + k], d * (float)((int)w[(k / 4) * 64 + k % 4] - 128), sum);
    }
    return sum;
}

// Row m's greedy token: the best exact logit among the threads' candidates for it whose upper
// bound reaches its final floor.
static int64_t pick(const float *x, int64_t K, const uint8_t *wq, const float *wd,
                    const Candidates *c, int threads, int64_t M, float floor_) {
    int64_t best = -1;
    float best_logit = -FLT_MAX;
    for (int th = 0; th < threads; th++)
        for (int j = 0; j < c[th * M].count; j++) {
            const int64_t n = c[th * M].n[j];
            if (c[th * M].hi[j] < floor_) continue;
            const float z = exact_logit(x, K, wq, wd, n);
            if (best < 0 || z > best_logit || (z == best_logit && n < best))
                best_logit = z, best = n;  // the first of equals, as argmax_rows
        }
    return best;
}

// Buffer `which` of this thread (thread_scratch.h), at least n bytes.
static void *scratch(int which, size_t n) {
    static __thread void *buf[5];
    static __thread size_t cap[5];
    return grow_scratch(&buf[which], &cap[which], n);
}

// x (M, K) float32; wq, wd, wl1 the screen's weights, scales and per-block |w|_1 for N
// vocabulary rows (in tiles of 16, the last padded); out (M) int64 greedy tokens. Returns 0,
// -1 for shapes it does not take, -2 without memory, -3 for a row of x that is not finite and
// -4 for a row the screen cannot narrow (the caller then computes the logits).
int greedy_head(const float *x, int64_t M, int64_t K, const uint8_t *wq, const float *wd,
                const float *wl1, int64_t N, int64_t *out) {
    if (M < 1 || K % QK != 0 || N < 1) return -1;
    const int64_t nb = K / QK, tiles = (N + TILE - 1) / TILE;
    const int threads = omp_get_max_threads();
    int8_t *xq = scratch(0, M * K);
    int32_t *bsum = scratch(1, sizeof(int32_t) * M * nb);
    float *s = scratch(2, sizeof(float) * M * nb);
    Candidates *cand = scratch(3, sizeof(Candidates) * threads * M);
    float *floors = scratch(4, sizeof(float) * M);
    if (!xq || !bsum || !s || !cand || !floors) return -2;
    for (int64_t m = 0; m < M; m++)
        if (!quantize_row(x + m * K, K, xq + m * K, bsum + m * nb, s + m * nb)) return -3;
    for (int64_t i = 0; i < threads * M; i++) cand[i].count = 0;
    for (int64_t m = 0; m < M; m++) floors[m] = -FLT_MAX;
    int overflow = 0;
#pragma omp parallel
    {
        Candidates *mine = cand + omp_get_thread_num() * M;
        __m512 lo[MB], hi[MB];
#pragma omp for schedule(static)
        for (int64_t t = 0; t < tiles; t++) {
            for (int64_t m0 = 0; m0 < M; m0 += MB) {
                const int rows = M - m0 < MB ? (int)(M - m0) : MB;
                if (rows == MB) screen_tile(xq, bsum, s, m0, MB, K, wq, wd, wl1, t, lo, hi);
                else screen_tile(xq, bsum, s, m0, rows, K, wq, wd, wl1, t, lo, hi);
                for (int i = 0; i < rows; i++)
                    if (!keep(mine + m0 + i, floors + m0 + i, lo[i], hi[i], t, N)) {
#pragma omp atomic write
                        overflow = 1;
                    }
            }
        }
#pragma omp for schedule(static)
        for (int64_t m = 0; m < M; m++)
            if (!overflow) out[m] = pick(x + m * K, K, wq, wd, cand + m, threads, M, floors[m]);
    }
    return overflow ? -4 : 0;
}

int greedy_head_built(void) { return 1; }
#else
int greedy_head(const float *x, int64_t M, int64_t K, const uint8_t *wq, const float *wd,
                const float *wl1, int64_t N, int64_t *out) {
    return -1;  // no AVX-512 VNNI in this build: the caller computes the logits
}

int greedy_head_built(void) { return 0; }
#endif
