"""The paged KV cache's layout, shared by the torch code and the C ops.

Per layer one tensor (2, num_kv_heads, num_blocks, block_size * head_dim), keys then values.
Token t of a sequence lives in block `block_table[t // block_size]` at offset
`t % block_size`; its flat slot is `block * block_size + offset`. A value block is
(block_size, head_dim); a key block is stored transposed, (head_dim, block_size), so that the
decode kernel gets a block's scores as one vector of block_size lanes (csrc/paged_attention.c).
The cache may be narrower than the activations (--kv-cache-dtype float16): keys and values are
rounded to its dtype when written and widened back to the query's when read.
"""

from __future__ import annotations

import torch


def key_blocks(kv_cache: torch.Tensor, head_dim: int) -> torch.Tensor:
    """(num_kv_heads, num_blocks, head_dim, block_size): each block's keys, transposed."""
    num_kv_heads, num_blocks, block_floats = kv_cache.shape[1:]
    return kv_cache[0].view(num_kv_heads, num_blocks, head_dim, block_floats // head_dim)


def value_blocks(kv_cache: torch.Tensor, head_dim: int) -> torch.Tensor:
    """(num_kv_heads, num_blocks, block_size, head_dim)."""
    num_kv_heads, num_blocks, block_floats = kv_cache.shape[1:]
    return kv_cache[1].view(num_kv_heads, num_blocks, block_floats // head_dim, head_dim)


def write_kv(k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """k, v (T, KVH, D) into the cache at each token's slot, in torch, rounded to its dtype
    (index_put takes only its own dtype)."""
    head_dim = k.shape[-1]
    keys, values = key_blocks(kv_cache, head_dim), value_blocks(kv_cache, head_dim)
    block_size = keys.shape[-1]
    k, v = k.to(kv_cache.dtype), v.to(kv_cache.dtype)  # no copy where the dtypes are equal
    keys[:, slot_mapping // block_size, :, slot_mapping % block_size] = k
    values.view(keys.shape[0], -1, head_dim)[:, slot_mapping] = v.transpose(0, 1)
