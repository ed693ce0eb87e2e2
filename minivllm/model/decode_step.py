"""A step's decoder layers in one C call (csrc/decode_step.c), where they can run so.

At batch 1 the forward is about 280 kernel calls of a few microseconds each, and the Python around
each call (dispatch, an output tensor, argument conversion) costs about as much again, so half
of a step was not arithmetic. On a GPU vLLM removes this launch overhead by replaying the step
as a CUDA graph (capture_model, vllm/v1/worker/gpu_model_runner.py:6417); its CPU backend has no
graphs (use_cuda_graph = False, vllm/v1/worker/cpu_model_runner.py:34) and compiles the model
with torch.compile instead (warming_up_model, :84). minivllm's equivalent is a loop in C over
the same kernels, in the same order, on the same buffers.

The loop knows one attention, decode attention (paged_attention.c). A step's prompt chunks run
in it too: each prompt token is a row with its chunk's block table and its own length, its
position + 1, so it attends to the keys up to itself, which is the causal mask (row_block_tables).
A step of decodes only gives op by op's numbers to the bit; with prompt tokens their attention
adds in another order than SDPA's, the same numbers to rounding.

It runs a step when everything the loop needs is there: one rank (no all-reduce between the
ops), float32 activations (the KV cache float32, float16 or bfloat16), every layer matrix in a
GGUF's blocks (quant_linear.py), the C ops built, prompt contexts up to MAX_PROMPT_CONTEXT, and
op_choice saying C for q_linear at this many rows (the matmuls are most of the step). The small
ops then run in C even where op_selection.py measured torch's version a little faster: that
measurement includes the Python call each op pays, which the loop does not.
Otherwise, and with MINIVLLM_DECODE_STEP=ops, llama.py runs the ops one by one.
"""

from __future__ import annotations

import ctypes
import math
import os

import torch

from minivllm.model import csrc_build, custom_ops, op_choice
from minivllm.model.attention import AttentionMetadata
from minivllm.model.kv_layout import key_blocks, value_blocks
from minivllm.model.quant_linear import QuantLinear

ENV = "MINIVLLM_DECODE_STEP"  # "c" (the default) or "ops": the op-by-op forward
# The longest prompt context the loop takes. A prompt token attends as a decode does, reading its
# whole context once per token, where a chunk's SDPA reads it once per chunk. Measured on the
# bundled model (scripts/mixed_step_bench.py, 2-vCPU Zen 4), op by op took 1.05-1.23x the loop's
# time up to 512-token contexts, 0.99-1.11x at 1024, 0.97x at 2048 and 0.81-0.88x at 4096-8192.
MAX_PROMPT_CONTEXT = 1024


class DecodeStep:
    """The layer table (pointers into the model's tensors, which live as long as the model, and
    into the KV caches, whose addresses every step checks) is built once per cache; the scratch
    buffers once for the most rows a step has had, smaller steps using their first rows."""

    def __init__(self, model) -> None:
        self.model = model
        self._table: tuple[tuple[int, ...], ctypes.Array] | None = None  # (cache addresses, table)
        self._scratch: tuple[int, list[torch.Tensor], ctypes.Array] | None = None

    @staticmethod
    def for_model(model) -> DecodeStep | None:
        """A DecodeStep where this model's layers can run in one call, else None."""
        if os.environ.get(ENV, "c") != "c" or model.tp.world_size != 1:
            return None
        if model.dtype != torch.float32 or csrc_build.load() is None:
            return None
        for layer in model.layers:
            mats = (layer.qkv, layer.o, layer.gate_up, layer.down)
            if not all(isinstance(m, QuantLinear) for m in mats) or layer.input_norm is None:
                return None
        return DecodeStep(model)

    def run(self, x: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor],
            meta: AttentionMetadata) -> torch.Tensor | None:
        """The final norm's output (n, hidden), x updated as the residual stream; None where
        this step must run op by op (nothing was changed then)."""
        n, kv_type = x.shape[0], custom_ops.kv_type(kv_caches[0])
        if n == 0 or kv_type is None or not op_choice.runs_in_c("q_linear", n):
            return None
        if any(chunk.context_len > MAX_PROMPT_CONTEXT for chunk in meta.prefills):
            return None
        m, c = self.model, self.model.config
        keys = key_blocks(kv_caches[0], c.head_dim)
        tables = row_block_tables(meta, n)
        positions = positions.to(torch.int64).contiguous()
        ints = [positions, meta.slot_mapping.to(torch.int64).contiguous(), positions + 1]
        dims = (ctypes.c_int64 * 11)(len(m.layers), n, c.hidden_size, m.num_heads,
                                     m.num_kv_heads, c.head_dim, c.intermediate_size,
                                     keys.shape[1], keys.shape[3], tables.shape[1], kv_type)
        h = torch.empty_like(x)
        rc = csrc_build.load().decode_layers(
            self._layer_table(kv_caches), dims, x.data_ptr(), h.data_ptr(), self._buffers(n),
            ints[0].data_ptr(), m.cos.data_ptr(), m.sin.data_ptr(), ints[1].data_ptr(),
            tables.data_ptr(), ints[2].data_ptr(), m.norm.data_ptr(), c.rms_norm_eps,
            1.0 / math.sqrt(c.head_dim))  # as attention.py
        if rc == -1:  # a head shape the attention ops do not take: refused before x changed
            return None
        custom_ops.check_attention(rc, "decode_layers")
        if rc:
            raise RuntimeError(f"C op decode_layers failed with code {rc}")
        return h

    def _layer_table(self, kv_caches: list[torch.Tensor]) -> ctypes.Array:
        addresses = tuple(cache.data_ptr() for cache in kv_caches)  # reallocated: a new table
        if self._table is None or self._table[0] != addresses:
            d = self.model.config.head_dim
            fields = []
            for layer, cache in zip(self.model.layers, kv_caches):
                for mat in (layer.qkv, layer.o, layer.gate_up, layer.down):
                    fields += [mat.weight.data.data_ptr(), mat.weight.kernel_qtype]
                fields += [layer.input_norm.data_ptr(), layer.post_norm.data_ptr(),
                           key_blocks(cache, d).data_ptr(), value_blocks(cache, d).data_ptr()]
            self._table = (addresses, (ctypes.c_int64 * len(fields))(*fields))
        return self._table[1]

    def _buffers(self, n: int) -> ctypes.Array:
        """decode_step.c's scratch for n rows: qkv, attention, delta, gate_up, activation."""
        if self._scratch is None or self._scratch[0] < n:
            m, c = self.model, self.model.config
            widths = ((m.num_heads + 2 * m.num_kv_heads) * c.head_dim,
                      m.num_heads * c.head_dim, c.hidden_size, 2 * c.intermediate_size,
                      c.intermediate_size)
            buffers = [torch.empty(n, w) for w in widths]
            pointers = (ctypes.c_void_p * len(buffers))(*(b.data_ptr() for b in buffers))
            self._scratch = (n, buffers, pointers)
        return self._scratch[2]


def row_block_tables(meta: AttentionMetadata, n: int) -> torch.Tensor:
    """(n, width) int64, each row's block table. A decode's row is its sequence's; every token
    of a prompt chunk gets its chunk's table and, with its own length (its position + 1),
    attends as a decode would: to the keys up to itself, which is the causal mask."""
    if not meta.prefills:
        return meta.decode_block_tables.to(torch.int64).contiguous()
    decodes = meta.decode_block_tables if meta.num_decodes else torch.zeros(0, 0, dtype=torch.int64)
    width = max([decodes.shape[1]] + [len(chunk.block_ids) for chunk in meta.prefills])
    tables = torch.zeros(n, width, dtype=torch.int64)
    tables[:meta.num_decodes, :decodes.shape[1]] = decodes
    for chunk in meta.prefills:
        tables[chunk.start:chunk.end, :len(chunk.block_ids)] = chunk.block_ids
    return tables
