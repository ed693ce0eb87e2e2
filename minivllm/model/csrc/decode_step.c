// A whole step's decoder layers in one call: the ops llama.py's forward runs one by one
// (RMSNorm, the four block matmuls, RoPE and the cache write, decode attention, SiLU-and-mul),
// in the same order on the same buffers. A prompt token is a row like a decode's, with its own
// length (model/decode_step.py row_block_tables), so the cache write of all rows comes before
// any row's attention, and each row attends to the keys up to itself. What goes is
// the Python between them: at batch 1 a step is ~300 small kernel calls, and each call's
// dispatch, tensor allocation and argument conversion cost about as much as the kernels.
// vLLM removes the same per-op overhead on GPUs by capturing the decode step as a CUDA graph
// (capture_model, vllm/v1/worker/gpu_model_runner.py:6417); minivllm's equivalent on a CPU is
// this loop in C (model/decode_step.py decides when it runs).
#include <stdint.h>

int q_linear(const float *x, const uint8_t *w, float *out, int64_t M, int64_t N, int64_t K,
             int64_t qtype);
int add_rms_norm(float *x, const float *delta, const float *weight, float *out, int64_t n,
                 int64_t hidden, float eps);
int rope_and_cache(float *qkv, int64_t row_stride, int64_t n, const int64_t *positions,
                   const float *cos, const float *sin, int64_t H, int64_t KVH, int64_t D,
                   void *k_blocks, void *v_blocks, int64_t NB, int64_t BS, const int64_t *slots,
                   int64_t kv_type);
int paged_decode(const float *q, int64_t q_stride, const void *k_blocks, const void *v_blocks,
                 const int64_t *tables, const int64_t *lens, float *out, int64_t n, int64_t H,
                 int64_t KVH, int64_t D, int64_t NB, int64_t BS, int64_t max_blocks, float scale,
                 int64_t kv_type);
int silu_and_mul(const float *x, float *out, int64_t n, int64_t I);

// Per layer, LAYER_FIELDS int64s: each matrix's blocks and ggml type, the two RMSNorm weights
// and the layer's key and value blocks (kv_layout.py).
enum { QKV, QKV_TYPE, O, O_TYPE, GATE_UP, GATE_UP_TYPE, DOWN, DOWN_TYPE, INPUT_NORM, POST_NORM,
       K_BLOCKS, V_BLOCKS, LAYER_FIELDS };
// dims: the model's and the step's sizes, and the KV cache's element type (kv_dtype.h).
enum { LAYERS, ROWS, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTERMEDIATE, NUM_BLOCKS, BLOCK_SIZE,
       MAX_BLOCKS, KV_TYPE, DIMS };
// scratch: a step's intermediate buffers, each rows x its width.
enum { QKV_OUT, ATTN_OUT, DELTA, GATE_UP_OUT, ACT, SCRATCH };

#define PTR(type, v) ((type *)(intptr_t)(v))
#define CHECK(call) do { const int rc_ = (call); if (rc_) return rc_; } while (0)

// x (rows, hidden): the residual stream, updated in place; h: the last RMSNorm's output (the
// final norm's). Returns 0, or the first failing op's code (-1 a shape it does not take: only
// layer 0's attention ops return it, before x changes; -2 no memory; -3 a sequence past its
// block table).
int decode_layers(const int64_t *layers, const int64_t *dims, float *x, float *h,
                  float *const *scratch, const int64_t *positions, const float *cos,
                  const float *sin, const int64_t *slots, const int64_t *tables,
                  const int64_t *lens, const float *final_norm, float eps, float scale) {
    const int64_t n = dims[ROWS], hidden = dims[HIDDEN], H = dims[HEADS], KVH = dims[KV_HEADS];
    const int64_t D = dims[HEAD_DIM], I = dims[INTERMEDIATE], row = (H + 2 * KVH) * D;
    float *qkv = scratch[QKV_OUT], *attn = scratch[ATTN_OUT], *delta = scratch[DELTA];
    float *gate_up = scratch[GATE_UP_OUT], *act = scratch[ACT];
    CHECK(add_rms_norm(x, 0, PTR(const float, layers[INPUT_NORM]), h, n, hidden, eps));
    for (int64_t l = 0; l < dims[LAYERS]; l++) {
        const int64_t *f = layers + l * LAYER_FIELDS;
        void *keys = PTR(void, f[K_BLOCKS]), *values = PTR(void, f[V_BLOCKS]);
        const float *next_norm = l + 1 < dims[LAYERS]
            ? PTR(const float, f[LAYER_FIELDS + INPUT_NORM]) : final_norm;
        CHECK(q_linear(h, PTR(const uint8_t, f[QKV]), qkv, n, row, hidden, f[QKV_TYPE]));
        CHECK(rope_and_cache(qkv, row, n, positions, cos, sin, H, KVH, D, keys, values,
                             dims[NUM_BLOCKS], dims[BLOCK_SIZE], slots, dims[KV_TYPE]));
        CHECK(paged_decode(qkv, row, keys, values, tables, lens, attn, n, H, KVH, D,
                           dims[NUM_BLOCKS], dims[BLOCK_SIZE], dims[MAX_BLOCKS], scale,
                           dims[KV_TYPE]));
        CHECK(q_linear(attn, PTR(const uint8_t, f[O]), delta, n, hidden, H * D, f[O_TYPE]));
        CHECK(add_rms_norm(x, delta, PTR(const float, f[POST_NORM]), h, n, hidden, eps));
        CHECK(q_linear(h, PTR(const uint8_t, f[GATE_UP]), gate_up, n, 2 * I, hidden,
                       f[GATE_UP_TYPE]));
        CHECK(silu_and_mul(gate_up, act, n, I));
        CHECK(q_linear(act, PTR(const uint8_t, f[DOWN]), delta, n, hidden, I, f[DOWN_TYPE]));
        CHECK(add_rms_norm(x, delta, next_norm, h, n, hidden, eps));
    }
    return 0;
}
