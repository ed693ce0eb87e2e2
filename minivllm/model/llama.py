"""The Llama architecture in torch: RMSNorm, RoPE, grouped-query attention over a paged KV
cache, SwiGLU, tied embeddings. The matmuls are `Linear`s (linear.py: their CPU fast paths and
their tensor-parallel splits); what lies between them (RoPE and the cache write, decode
attention, SiLU-and-mul, residual add + RMSNorm) runs as fused ops (custom_ops.py), in C where
they are built, else in torch.

Weights are kept as Hugging Face stores them, (out, in), with q/k/v fused into one matrix and
gate/up into another, so a layer is four matmuls. RMSNorm's weight is folded into the matmul
that follows it (fold_norm). A GGUF's Q4_0/Q4_1/Q8_0 matrices stay in their blocks in float32
runs (quant_linear.py: the norm then applies its own weight); with --quantization none,
or in bfloat16, they are dequantized at load. With tensor parallelism each rank holds whole heads:
qkv and gate_up are column-parallel, o and down row-parallel, as in vLLM (LlamaAttention and
LlamaMLP in vllm/model_executor/models/llama.py), so a layer all-reduces twice.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minivllm.distributed.parallel_state import TPGroup, get_tp_group
from minivllm.model import custom_ops, greedy_head, op_selection, quant_linear, weight_arena
from minivllm.model.attention import AttentionMetadata, PrefillChunk, paged_attention
from minivllm.model.config import ModelConfig, check_tensor_parallel_size
from minivllm.model.decode_step import DecodeStep
from minivllm.model.linear import (ColumnParallelLinear, Linear, ParallelLMHead, RowParallelLinear,
                                   VocabParallelEmbedding)
from minivllm.model.quant_linear import (QuantColumnParallelLinear, QuantLinear, QuantLMHead,
                                         QuantRowParallelLinear, QuantWeight)


def fold_norm(w: torch.Tensor, norm_weight: torch.Tensor) -> torch.Tensor:
    """(out, in) -> W diag(g): RMSNorm's weight g moved into the matmul that follows it, since
    (x_hat * g) @ W^T == x_hat @ (W diag(g))^T. Exact up to rounding; one op less per norm."""
    return w * norm_weight[None, :]


@dataclass
class LayerWeights:  # each a Linear, or a QuantLinear on a GGUF's blocks (quant_linear.py)
    qkv: Linear | QuantLinear  # ((heads + 2 * kv_heads) * head_dim / N, hidden), this rank's heads
    o: Linear | QuantLinear  # (hidden, heads * head_dim / N), all-reduced
    gate_up: Linear | QuantLinear  # (2 * intermediate / N, hidden)
    down: Linear | QuantLinear  # (hidden, intermediate / N), all-reduced
    # The RMSNorm weights before qkv and gate_up where they could not fold (blocks), else None
    input_norm: torch.Tensor | None = None
    post_norm: torch.Tensor | None = None


def rope_tables(config: ModelConfig, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin per position, (max_position, head_dim), for the rotate_half layout; the
    sin table carries rotate_half's sign so that RoPE is x * cos + roll(x, d/2) * sin."""
    d = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    freqs = torch.outer(torch.arange(config.max_position, dtype=torch.float32), inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)
    sign = torch.cat([-torch.ones(d // 2), torch.ones(d // 2)])
    return emb.cos().to(dtype), (emb.sin() * sign).to(dtype)


class LlamaModel:
    def __init__(self, config: ModelConfig, weights: dict[str, torch.Tensor],
                 dtype: torch.dtype = torch.float32, parts: int | None = None,
                 tp: TPGroup | None = None, kv_cache_dtype: torch.dtype | None = None) -> None:
        self.config, self.dtype = config, dtype
        self.kv_cache_dtype = kv_cache_dtype or dtype  # the cache's elements; activations: dtype
        self.tp = tp or get_tp_group()
        self.parts = parts or torch.get_num_threads()  # row slabs per matrix
        c, n, parts = config, self.tp.world_size, self.parts
        check_tensor_parallel_size(c, n)
        self.num_heads, self.num_kv_heads = c.num_heads // n, c.num_kv_heads // n  # this rank's
        self.q_size = self.num_heads * c.head_dim

        def take(name: str) -> torch.Tensor:  # float32: folding rounds once, in to(dtype)
            if name not in weights:
                raise KeyError(f"weight {name!r} missing from the checkpoint")
            return weights[name].float()

        def fused(*names: str, norm: str) -> torch.Tensor:
            w = torch.cat([take(name) for name in names], dim=0)  # (out, in) pieces -> one
            return fold_norm(w, take(norm)).to(dtype)

        def blocks(*names: str) -> QuantWeight | None:  # the GGUF's blocks, float32 runs only
            pieces = [weights.get(name) for name in names]
            if dtype != torch.float32 or not all(isinstance(p, QuantWeight) for p in pieces):
                return None
            return quant_linear.cat(pieces)

        def column(*names: str, norm: str) -> tuple[Linear | QuantLinear, torch.Tensor | None]:
            """The layer, and the norm weight that stays with the norm (None where folded)."""
            w = blocks(*names)
            if w is None:
                return ColumnParallelLinear(fused(*names, norm=norm), parts, self.tp,
                                            fused_sizes(*names)), None
            return QuantColumnParallelLinear(w, self.tp, fused_sizes(*names)), take(norm)

        def fused_sizes(*names: str) -> list[int]:
            return [weights[name].shape[0] for name in names]

        def row(name: str) -> Linear | QuantLinear:
            w = blocks(name)
            if w is None or not quant_linear.row_shardable(w, n):
                return RowParallelLinear(take(name).to(dtype), parts, self.tp)
            return QuantRowParallelLinear(w, self.tp)

        self.layers = []
        for i in range(c.num_layers):
            p = f"model.layers.{i}."
            qkv, input_norm = column(*(p + f"self_attn.{x}_proj.weight" for x in "qkv"),
                                     norm=p + "input_layernorm.weight")
            gate_up, post_norm = column(p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight",
                                        norm=p + "post_attention_layernorm.weight")
            self.layers.append(LayerWeights(qkv, row(p + "self_attn.o_proj.weight"), gate_up,
                                            row(p + "mlp.down_proj.weight"), input_norm,
                                            post_norm))
        self._gather_blocks()
        # The final norm stays: the head is also the embedding when tied, so it cannot fold.
        self.norm = take("model.norm.weight").to(dtype)
        # One (vocab, hidden) matrix is the output head and, by rows, the embedding.
        head = "model.embed_tokens.weight" if c.tie_word_embeddings else "lm_head.weight"
        self.lm_head = (QuantLMHead(blocks(head), self.tp) if blocks(head) is not None else
                        ParallelLMHead(take(head).to(dtype), parts, self.tp))
        self.embed_tokens = (self.lm_head if c.tie_word_embeddings else VocabParallelEmbedding(
            take("model.embed_tokens.weight").to(dtype), self.tp))
        self.cos, self.sin = rope_tables(c, dtype)
        op_selection.prepare(dtype)  # build and choose the C ops, or warn of emulated bfloat16
        self.screen = (greedy_head.build_screen(self.lm_head.blocks.blocks()[:c.vocab_size],
                                                self.lm_head.blocks.qtype, c.hidden_size)
                       if isinstance(self.lm_head, QuantLMHead) and self.tp.world_size == 1
                       and dtype == torch.float32 else None)  # greedy steps skip the logits
        self.decode_step = DecodeStep.for_model(self)  # the layers in one C call, where they can

    def _gather_blocks(self) -> None:
        """The layers' quantized matrices into one allocation: 2 MiB pages (weight_arena.py)."""
        mats = [m for layer in self.layers for m in (layer.qkv, layer.o, layer.gate_up, layer.down)
                if isinstance(m, QuantLinear)]
        for m, data in zip(mats, weight_arena.gather([m.weight.data for m in mats])):
            m.weight.data = data

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[torch.Tensor], meta: AttentionMetadata) -> torch.Tensor:
        """Hidden states (num_tokens, hidden) after the final norm; writes the KV cache."""
        c = self.config
        n, eps = input_ids.shape[0], c.rms_norm_eps
        x = self.embed_tokens(input_ids).contiguous()  # the residual stream
        if self.decode_step is not None:  # every layer in one C call, where it can
            h = self.decode_step.run(x, positions, kv_caches, meta)
            if h is not None:
                return h
        # norm weights are folded into qkv and gate_up (None here), except on blocks
        h = custom_ops.rms_norm(x, self.layers[0].input_norm, eps)
        for i, (layer, kv_cache) in enumerate(zip(self.layers, kv_caches)):
            qkv = layer.qkv(h).contiguous()
            custom_ops.rope_and_cache(qkv, positions, self.cos, self.sin, self.num_heads,
                                      self.num_kv_heads, c.head_dim, kv_cache, meta.slot_mapping)
            q = qkv[:, :self.q_size].view(n, self.num_heads, c.head_dim)
            h = custom_ops.rms_norm(x, layer.post_norm, eps,
                                    delta=layer.o(paged_attention(q, kv_cache, meta)))
            last = i == len(self.layers) - 1  # the final norm keeps its weight: see __init__
            h = custom_ops.rms_norm(x, self.norm if last else self.layers[i + 1].input_norm, eps,
                                    delta=layer.down(custom_ops.silu_and_mul(layer.gate_up(h))))
        return h

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """(M, vocab) float32 on rank 0, the output rank; None on the other ranks."""
        return self.lm_head.logits(hidden)

    def greedy_tokens(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """compute_logits(hidden).argmax(-1) without most of the logits (greedy_head.py), or
        None where the screen does not run (no AVX-512 VNNI, not Q8_0, tensor parallel)."""
        return None if self.screen is None else greedy_head.greedy_tokens(hidden, self.screen)

    @torch.inference_mode()
    def score(self, token_ids: list[int], block_size: int = 16) -> torch.Tensor | None:
        """Logits (n, vocab) at every position of one sequence, in one prefill on a scratch
        cache: what tests use to find near-ties and to compare against a reference."""
        n = len(token_ids)
        num_blocks = -(-n // block_size)
        positions = torch.arange(n)
        meta = AttentionMetadata(slot_mapping=positions, prefills=[
            PrefillChunk(0, n, n, torch.arange(num_blocks))])
        hidden = self.forward(torch.tensor(token_ids), positions,
                              self.allocate_kv_cache(num_blocks, block_size), meta)
        return self.compute_logits(hidden)

    def weight_bytes_per_step(self) -> int:
        """Bytes of weights one decode step reads on this rank: every layer matrix as it is
        stored (a GGUF's blocks, or float), the norm weights, the output head."""
        matrices = [m for layer in self.layers for m in (layer.qkv, layer.o, layer.gate_up,
                                                         layer.down)]
        norms = [n for layer in self.layers for n in (layer.input_norm, layer.post_norm)
                 if n is not None] + [self.norm]
        return (sum(stored_bytes(m) for m in matrices) + stored_bytes(self.lm_head.linear)
                + sum(n.nbytes for n in norms))

    def allocate_kv_cache(self, num_blocks: int, block_size: int) -> list[torch.Tensor]:
        """Per layer (2, this rank's kv heads, blocks, block_size * head_dim), in the cache's
        dtype: kv_layout.py."""
        c = self.config
        shape = (2, self.num_kv_heads, num_blocks, block_size * c.head_dim)
        return [torch.zeros(shape, dtype=self.kv_cache_dtype) for _ in range(c.num_layers)]


def stored_bytes(linear: Linear | QuantLinear) -> int:
    """The bytes a batch-1 matmul streams: the blocks, or the float rows."""
    if isinstance(linear, QuantLinear):
        return linear.weight.data.nbytes
    return linear.weight.nbytes
