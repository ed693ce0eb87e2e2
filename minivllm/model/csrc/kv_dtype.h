/* The KV cache's element types (vLLM's --kv-cache-dtype; custom_ops.KV_TYPES): keys and values
 * are float32 in the ops' arithmetic, rounded to the cache's type when stored and widened back
 * when loaded. The rounding is torch's `.to(dtype)`, to the bit (round to nearest even), so the C
 * ops and the torch ops write the same caches.
 *
 * Called with a constant `kt` (always_inline), the branches fold away. gcc 12 vectorises no
 * _Float16 conversion without AVX512-FP16 (one vcvtph2ps per element), so the vectorised loops
 * load whole vectors with kv_load_vec: F16C's vcvtph2ps (x86-64-v3 and later) for float16, a
 * widening shift for bfloat16. */
#ifndef MINIVLLM_KV_DTYPE_H
#define MINIVLLM_KV_DTYPE_H

#include <stdint.h>
#include <string.h>
#if defined(__F16C__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

enum { KV_F32 = 0, KV_F16 = 1, KV_BF16 = 2 };

static inline int kv_type_ok(int64_t kt) { return kt == KV_F32 || kt == KV_F16 || kt == KV_BF16; }

static inline int64_t kv_itemsize(int64_t kt) { return kt == KV_F32 ? 4 : 2; }

/* bfloat16 is float32's top half: round to nearest even on the 16 bits dropped (as c10's
 * round_to_nearest_even); a NaN keeps its sign and top payload bits, with the quiet bit set so
 * that it cannot round to infinity. */
static inline uint16_t bf16_from_float(float x) {
    uint32_t b;
    memcpy(&b, &x, sizeof b);
    if ((b & 0x7fffffffu) > 0x7f800000u) return (uint16_t)(b >> 16 | 0x40);
    return (uint16_t)((b + 0x7fffu + (b >> 16 & 1)) >> 16);
}

static inline __attribute__((always_inline)) float kv_load(const void *base, int64_t i,
                                                           const int kt) {
    if (kt == KV_F16) return (float)((const _Float16 *)base)[i];
    if (kt == KV_BF16) {
        const uint32_t b = (uint32_t)((const uint16_t *)base)[i] << 16;
        float x;
        memcpy(&x, &b, sizeof x);
        return x;
    }
    return ((const float *)base)[i];
}

static inline __attribute__((always_inline)) void kv_store(void *base, int64_t i, float x,
                                                           const int kt) {
    if (kt == KV_F16) ((_Float16 *)base)[i] = (_Float16)x;
    else if (kt == KV_BF16) ((uint16_t *)base)[i] = bf16_from_float(x);
    else ((float *)base)[i] = x;
}

/* KV_LANES elements of the cache from `at` as one vector of floats (the width cpu_ops.c's vec
 * has): the vectorised loops' load. */
#if defined(__AVX512F__)
#define KV_LANES 16
#else
#define KV_LANES 8
#endif
typedef float kv_vec __attribute__((vector_size(4 * KV_LANES)));
typedef uint16_t kv_halves __attribute__((vector_size(2 * KV_LANES)));
typedef uint32_t kv_words __attribute__((vector_size(4 * KV_LANES)));

static inline __attribute__((always_inline)) kv_vec kv_load_vec(const void *base, int64_t at,
                                                                const int kt) {
    kv_vec v;
    if (kt == KV_F32) {
        memcpy(&v, (const float *)base + at, sizeof v);
        return v;
    }
    kv_halves h;
    memcpy(&h, (const uint16_t *)base + at, sizeof h);
    if (kt == KV_BF16) {
        const kv_words w = __builtin_convertvector(h, kv_words) << 16;
        memcpy(&v, &w, sizeof v);
        return v;
    }
#if defined(__AVX512F__)
    return (kv_vec)_mm512_cvtph_ps((__m256i)h);
#elif defined(__F16C__)
    return (kv_vec)_mm256_cvtph_ps((__m128i)h);
#else
    for (int i = 0; i < KV_LANES; i++) v[i] = kv_load(base, at + i, kt);
    return v;
#endif
}

#endif
