"""Attention over a paged KV cache (its layout: kv_layout.py).

A step's tokens are flattened: first the decode sequences (one query token each), then the
prefill chunks (many query tokens each, with earlier context possibly already cached). Decodes
run in one call of the C op, which reads each sequence's blocks in place through its block
table (custom_ops.paged_decode_c); where it cannot run (bfloat16 activations, no compiler) they
are gathered into a dense copy for two matmuls and a softmax. Each prefill chunk is one
`scaled_dot_product_attention` call over its context. In vLLM the same split is made by
reorder_batch_to_split_decodes_and_prefills in vllm/v1/attention/backends/utils.py.
The new tokens' keys and values are already in the cache (custom_ops.rope_and_cache). A cache
narrower than q (--kv-cache-dtype) is widened to q's dtype as it is read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from minivllm.model import custom_ops, op_choice
from minivllm.model.kv_layout import key_blocks, value_blocks


@dataclass
class PrefillChunk:
    start: int  # first query token in the flattened batch
    end: int
    context_len: int  # tokens in the cache after this chunk, including it
    block_ids: torch.Tensor  # (ceil(context_len / block_size),) int64


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # (num_tokens,) int64: where each token's K/V is written
    num_decodes: int = 0
    decode_block_tables: torch.Tensor | None = None  # (num_decodes, max_blocks) int64
    decode_seq_lens: torch.Tensor | None = None  # (num_decodes,) int64, the new token included
    prefills: list[PrefillChunk] = field(default_factory=list)


def decode_bias(seq_lens: torch.Tensor, num_slots: int, dtype: torch.dtype) -> torch.Tensor:
    """(n, num_slots): 0 where key j < seq_len, -inf past the end (padding holds stale data)."""
    pad = torch.arange(num_slots)[None, :] >= seq_lens[:, None]
    return torch.zeros(pad.shape, dtype=dtype).masked_fill_(pad, float("-inf"))


def paged_attention(q: torch.Tensor, kv_cache: torch.Tensor,
                    meta: AttentionMetadata) -> torch.Tensor:
    """q (T, H, D) -> (T, H * D), over the cache, which already holds the step's k and v."""
    num_tokens, num_heads, head_dim = q.shape
    scale = 1.0 / math.sqrt(head_dim)
    n = meta.num_decodes
    if n == num_tokens:  # decodes only: no output buffer to copy into
        return _decode(q, kv_cache, meta, scale)
    out = torch.empty(num_tokens, num_heads * head_dim, dtype=q.dtype)
    if n:
        out[:n] = _decode(q[:n], kv_cache, meta, scale)
    for chunk in meta.prefills:
        out[chunk.start:chunk.end] = _prefill(q[chunk.start:chunk.end], kv_cache, chunk)
    return out


def _decode(q: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata,
            scale: float) -> torch.Tensor:
    out = None
    if op_choice.runs_in_c("paged_decode", q.shape[0]):
        out = custom_ops.paged_decode_c(q, kv_cache, meta.decode_block_tables,
                                        meta.decode_seq_lens, scale)
    return decode_torch(q, kv_cache, meta, scale) if out is None else out


def decode_torch(q: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata,
                  scale: float) -> torch.Tensor:
    """The same in plain torch: gather every sequence's blocks, then matmul, softmax, matmul."""
    n, num_heads, head_dim = q.shape
    keys_t, values = key_blocks(kv_cache, head_dim), value_blocks(kv_cache, head_dim)
    num_kv_heads, _, _, block_size = keys_t.shape
    group, tables = num_heads // num_kv_heads, meta.decode_block_tables
    nb = tables.shape[1]
    keys_t = keys_t.index_select(1, tables.flatten()).view(num_kv_heads, n, nb, head_dim, -1)
    values = values.index_select(1, tables.flatten()).view(num_kv_heads, n, -1, head_dim)
    keys_t, values = keys_t.to(q.dtype), values.to(q.dtype)  # no copy where they are equal
    qg = q.view(n, num_kv_heads, group, head_dim).transpose(0, 1)  # (KVH, n, group, D)
    scores = torch.matmul(qg[:, :, None], keys_t)  # (KVH, n, nb, group, block_size)
    scores = scores.transpose(2, 3).reshape(num_kv_heads, n, group, nb * block_size)
    bias = decode_bias(meta.decode_seq_lens, nb * block_size, q.dtype)[None, :, None]
    probs = torch.softmax(scores.mul_(scale).add_(bias), dim=-1)
    return torch.matmul(probs, values).transpose(0, 1).reshape(n, num_heads * head_dim)


def _prefill(q: torch.Tensor, kv_cache: torch.Tensor, chunk: PrefillChunk) -> torch.Tensor:
    n, num_heads, head_dim = q.shape
    ctx = chunk.context_len
    keys_t = key_blocks(kv_cache, head_dim)[:, chunk.block_ids]  # (KVH, nb, D, bs)
    num_kv_heads = keys_t.shape[0]
    keys = keys_t.transpose(-1, -2).reshape(num_kv_heads, -1, head_dim)[None, :, :ctx]
    values = value_blocks(kv_cache, head_dim)[:, chunk.block_ids]
    values = values.reshape(num_kv_heads, -1, head_dim)[None, :, :ctx]
    keys, values = keys.to(q.dtype), values.to(q.dtype)  # widened from a 16-bit cache
    qh = q.transpose(0, 1)[None]  # (1, H, n, D)
    if ctx == n:
        o = F.scaled_dot_product_attention(qh, keys, values, is_causal=True, enable_gqa=True)
    else:  # query i sits at position ctx - n + i and sees keys 0..that position
        mask = torch.ones(n, ctx, dtype=torch.bool).tril_(ctx - n)
        o = F.scaled_dot_product_attention(qh, keys, values, attn_mask=mask, enable_gqa=True)
    return o[0].transpose(0, 1).reshape(n, num_heads * head_dim)
