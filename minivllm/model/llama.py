"""The Llama architecture in torch: RMSNorm, RoPE, grouped-query attention over a paged KV
cache, SwiGLU, tied embeddings. The matmuls are torch's; what lies between them (RoPE and the
cache write, decode attention, SiLU-and-mul, residual add + RMSNorm) runs as fused ops
(custom_ops.py), in C where they are built, else in torch.

Weights are kept as Hugging Face stores them, (out, in), with q/k/v fused into one matrix and
gate/up into another, so a layer is four matmuls.

MKL runs a skinny matmul (a decode step: a few rows times a big matrix) on one thread, which
reads memory at about half the speed two cores can. So each matrix is split by output rows into
one slab per thread, (parts, out / parts, in) (a view, no copy), and applied with one `bmm`,
which runs the slabs in parallel: tensor parallelism across the cores of one CPU. Tensor
parallelism across workers later splits the same way (qkv and gate_up by output rows, o and
down by input columns), as vLLM does: MergedColumnParallelLinear and RowParallelLinear in
vllm/model_executor/models/llama.py:95 and :103.

For many rows (prefill, decode batches of 8 and more) each `Linear` also keeps a copy in
oneDNN's prepacked layout, which ran batch-32 decode 1.6x faster than the bmm form here.

For a few rows (batch 1-7 decode) in float32 the C op `skinny_linear` streams the row-major
weights itself, each thread a contiguous range of rows with prefetching ahead: ~5% faster per
step than the bmm at batch 1 when the machine is quiet (~62 against ~57 GB/s), equal when it
is busy. Where it is not built, `matmul` computes W @ x^T, because MKL's kernel for that
streams the weights faster than x @ W^T (at batch 1, about 41 against 35 GB/s); its result is
an (M, out) view with column-major strides, which the next matmul reads without a copy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minivllm.model import csrc_build, custom_ops
from minivllm.model.attention import AttentionMetadata, PrefillChunk, paged_attention
from minivllm.model.config import ModelConfig

SKINNY_BELOW = 8  # rows: below, W @ x^T is faster (batch 1: 1.2x); from 8 up, x @ W^T (batch 32: 1.1x)


def split_rows(w: torch.Tensor, parts: int) -> torch.Tensor:
    """(out, in) -> (parts, out / parts, in), contiguous; one part if out does not divide."""
    w = w.contiguous()
    return w[None] if parts < 2 or w.shape[0] % parts else w.view(parts, -1, w.shape[1])


def matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x (M, in), any strides, @ a row-split weight (parts, out / parts, in) -> (M, out)."""
    parts, rows, n_in = w.shape
    m = x.shape[0]
    if m < SKINNY_BELOW:  # (parts, out / parts, M), returned as the transpose of (out, M)
        return torch.bmm(w, x.t().expand(parts, n_in, m)).view(parts * rows, m).t()
    out = torch.bmm(x.contiguous().expand(parts, m, n_in), w.transpose(1, 2))
    return out.transpose(0, 1).reshape(m, parts * rows)


class Linear:
    """One weight matrix in two layouts: the row split that `matmul` streams for a few rows, and
    oneDNN's blocked layout, reordered once at load, for many rows (prefill, decode batches of 8
    and more). At 32 rows that ran these shapes 2-3x faster than MKL's bmm here: MKL repacks the
    weights on every call, oneDNN reads them packed. The second layout costs the weights' memory
    again. (torch.ops.mkldnn._reorder_linear_weight / _linear_pointwise are what inductor's
    weight prepacking uses for CPU linears.)"""

    def __init__(self, w: torch.Tensor, parts: int):
        self.split = split_rows(w, parts)
        self.weight = self.split.view(-1, self.split.shape[-1])  # (out, in), the same storage
        self.packed = onednn_pack(w)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # bfloat16 always takes oneDNN: MKL's bf16 bmm streamed the weights at 13 GB/s here,
        # oneDNN at 44 (with avx512_bf16)
        if self.packed is not None and (x.shape[0] >= SKINNY_BELOW or x.dtype != torch.float32):
            return onednn_linear(x, self.packed)
        y = custom_ops.skinny_linear(x, self.weight)
        return matmul(x, self.split) if y is None else y


ONEDNN_BATCH_HINT = 32  # rows the blocked layout is tuned for; any row count works with it


def onednn_linear(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    """x (M, in) @ a weight packed by onednn_pack -> (M, out)."""
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, None, "none", [], "")


def onednn_pack(w: torch.Tensor) -> torch.Tensor | None:
    """oneDNN's layout of an (out, in) weight, or None where this torch build has no oneDNN."""
    if not torch.backends.mkldnn.is_available() or w.dtype not in (torch.float32, torch.bfloat16):
        return None
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(w.contiguous(), ONEDNN_BATCH_HINT)
        onednn_linear(torch.zeros(1, w.shape[1], dtype=w.dtype), packed)
        return packed
    except (RuntimeError, AttributeError):  # an old build, or bf16 without the CPU instructions
        return None


def fold_norm(w: torch.Tensor, norm_weight: torch.Tensor) -> torch.Tensor:
    """(out, in) -> W diag(g): RMSNorm's weight g moved into the matmul that follows it, since
    (x_hat * g) @ W^T == x_hat @ (W diag(g))^T. Exact up to rounding; one op less per norm."""
    return w * norm_weight[None, :]


@dataclass
class LayerWeights:
    qkv: Linear  # ((heads + 2 * kv_heads) * head_dim, hidden)
    o: Linear  # (hidden, heads * head_dim)
    gate_up: Linear  # (2 * intermediate, hidden)
    down: Linear  # (hidden, intermediate)


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
                 dtype: torch.dtype = torch.float32, parts: int | None = None) -> None:
        self.config, self.dtype = config, dtype
        self.parts = parts or torch.get_num_threads()  # row slabs per matrix
        c = config
        self.q_size = c.num_heads * c.head_dim

        def take(name: str) -> torch.Tensor:  # float32: folding rounds once, in to(dtype)
            if name not in weights:
                raise KeyError(f"weight {name!r} missing from the checkpoint")
            return weights[name].float()

        def matrix(*names: str, norm: str | None = None) -> Linear:
            w = torch.cat([take(n) for n in names], dim=0)  # (out, in) pieces -> one matrix
            w = fold_norm(w, take(norm)) if norm else w
            return Linear(w.to(dtype), self.parts)

        self.layers = []
        for i in range(c.num_layers):
            p = f"model.layers.{i}."
            self.layers.append(LayerWeights(
                qkv=matrix(*(p + f"self_attn.{x}_proj.weight" for x in "qkv"),
                           norm=p + "input_layernorm.weight"),
                o=matrix(p + "self_attn.o_proj.weight"),
                gate_up=matrix(p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight",
                               norm=p + "post_attention_layernorm.weight"),
                down=matrix(p + "mlp.down_proj.weight")))
        # The final norm stays: the head is also the embedding when tied, so it cannot fold.
        self.norm = take("model.norm.weight").to(dtype)
        # One (vocab, hidden) matrix is the output head and, by rows, the embedding.
        head = "model.embed_tokens.weight" if c.tie_word_embeddings else "lm_head.weight"
        self.lm_head = matrix(head)
        self.embed_tokens = (None if c.tie_word_embeddings
                             else take("model.embed_tokens.weight").to(dtype).contiguous())
        self.cos, self.sin = rope_tables(c, dtype)
        if dtype == torch.float32:
            csrc_build.load()  # build the C ops now (or warn, once), not in the first step

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.embed_tokens is not None:
            return self.embed_tokens[input_ids]
        return self.lm_head.weight[input_ids]

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[torch.Tensor], meta: AttentionMetadata) -> torch.Tensor:
        """Hidden states (num_tokens, hidden) after the final norm; writes the KV cache."""
        c = self.config
        n, eps = input_ids.shape[0], c.rms_norm_eps
        x = self.embed(input_ids).contiguous()  # the residual stream
        h = custom_ops.rms_norm(x, None, eps)  # norm weights are folded into qkv and gate_up
        for i, (layer, kv_cache) in enumerate(zip(self.layers, kv_caches)):
            qkv = layer.qkv(h).contiguous()
            custom_ops.rope_and_cache(qkv, positions, self.cos, self.sin, c.num_heads,
                                      c.num_kv_heads, c.head_dim, kv_cache, meta.slot_mapping)
            q = qkv[:, :self.q_size].view(n, c.num_heads, c.head_dim)
            h = custom_ops.rms_norm(x, None, eps, delta=layer.o(paged_attention(q, kv_cache, meta)))
            last = i == len(self.layers) - 1  # the final norm keeps its weight: see __init__
            h = custom_ops.rms_norm(x, self.norm if last else None, eps,
                                    delta=layer.down(custom_ops.silu_and_mul(layer.gate_up(h))))
        return h

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()

    @torch.inference_mode()
    def score(self, token_ids: list[int], block_size: int = 16) -> torch.Tensor:
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

    def allocate_kv_cache(self, num_blocks: int, block_size: int) -> list[torch.Tensor]:
        """Per layer (2, kv heads, blocks, block_size * head_dim): see kv_layout.py."""
        c = self.config
        shape = (2, c.num_kv_heads, num_blocks, block_size * c.head_dim)
        return [torch.zeros(shape, dtype=self.dtype) for _ in range(c.num_layers)]

    @staticmethod
    def kv_bytes_per_token(config: ModelConfig, dtype: torch.dtype) -> int:
        itemsize = torch.empty(0, dtype=dtype).element_size()
        return 2 * config.num_layers * config.num_kv_heads * config.head_dim * itemsize
