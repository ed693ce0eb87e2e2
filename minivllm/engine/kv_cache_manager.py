"""The KV cache's block allocator, with prefix caching by chained block hashes.

The cache is `num_blocks` blocks of `block_size` tokens. A request owns a list of block ids
(its block table). A full block is identified by hash(parent block's hash, its token ids), so
equal hashes mean the whole prefix up to and including that block is equal: a block is reused
only when everything before it matches too.

Blocks with no owner stay in `free_blocks`, oldest first, and keep their hash: a later request
with the same prefix takes them back (a cache hit) until allocation evicts them, oldest first.
In vLLM: get_computed_blocks and allocate_slots, vllm/v1/core/kv_cache_manager.py (KVCacheManager.get_computed_blocks) and KVCacheManager.allocate_slots;
cache_full_blocks, vllm/v1/core/block_pool.py (BlockPool.cache_full_blocks); FreeKVCacheBlockQueue and hash_block_tokens,
vllm/v1/core/kv_cache_utils.py (FreeKVCacheBlockQueue) and hash_block_tokens.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import TYPE_CHECKING, Sequence

import numpy as np

if TYPE_CHECKING:
    from minivllm.engine.request import Request

NONE_HASH = bytes(32)  # the parent of a request's first block


def hash_block_tokens(parent: bytes, token_ids: Sequence[int]) -> bytes:
    """sha256 of the parent hash and the block's tokens: collisions are not a practical risk."""
    return hashlib.sha256(parent + np.asarray(token_ids, np.int32).tobytes()).digest()


class KVCacheBlock:
    __slots__ = ("block_id", "ref_cnt", "block_hash")

    def __init__(self, block_id: int) -> None:
        self.block_id, self.ref_cnt, self.block_hash = block_id, 0, None


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True) -> None:
        self.block_size, self.enable_caching = block_size, enable_caching
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.free_blocks: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.cached_blocks: dict[bytes, int] = {}  # block hash -> block id
        self.req_to_blocks: dict[str, list[int]] = {}
        self.num_cached_blocks: dict[str, int] = {}  # leading blocks of a request already hashed

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks)

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / len(self.blocks)

    def get_block_ids(self, request_id: str) -> list[int]:
        return self.req_to_blocks.get(request_id, [])

    def get_computed_blocks(self, request: "Request") -> list[int]:
        """The longest cached prefix of full blocks. At least one token is left to compute,
        because the step must produce the logits of the last one."""
        if not self.enable_caching or request.sampling_params.prompt_logprobs is not None:
            return []  # prompt logprobs need every position run (vllm/sampling_params.py:625-632)
        hits = []
        for block_hash in request.block_hashes[:(request.num_tokens - 1) // self.block_size]:
            block_id = self.cached_blocks.get(block_hash)
            if block_id is None:
                break
            hits.append(block_id)
        return hits

    def allocate_slots(self, request: "Request", num_new_tokens: int,
                       new_computed_blocks: Sequence[int] = ()) -> bool:
        """Make room for num_new_tokens more tokens; False (and no change) if blocks run out."""
        blocks = self.req_to_blocks.setdefault(request.request_id, [])
        num_computed = request.num_computed_tokens + len(new_computed_blocks) * self.block_size
        total = num_computed + num_new_tokens
        num_needed = -(-total // self.block_size) - len(blocks) - len(new_computed_blocks)
        reclaimed = sum(1 for b in new_computed_blocks if self.blocks[b].ref_cnt == 0)
        if num_needed > self.num_free_blocks - reclaimed:
            return False
        for block_id in new_computed_blocks:  # cache hits: take them back from the free list
            if self.blocks[block_id].ref_cnt == 0:
                del self.free_blocks[block_id]
            self.blocks[block_id].ref_cnt += 1
            blocks.append(block_id)
        for _ in range(max(num_needed, 0)):
            block_id, _ = self.free_blocks.popitem(last=False)  # the oldest free block
            block = self.blocks[block_id]
            if block.block_hash is not None:  # evict its cached content
                del self.cached_blocks[block.block_hash]
                block.block_hash = None
            block.ref_cnt = 1
            blocks.append(block_id)
        if self.enable_caching:
            self._cache_full_blocks(request, blocks, min(total, request.num_tokens) // self.block_size)
        return True

    def _cache_full_blocks(self, request: "Request", blocks: list[int], num_full: int) -> None:
        """Register the request's newly full blocks (their tokens are known at schedule time;
        their K/V are written by this step's forward before any layer reads them)."""
        start = self.num_cached_blocks.get(request.request_id, 0)
        for i in range(start, num_full):
            block_hash, block = request.block_hashes[i], self.blocks[blocks[i]]
            if block.block_hash is None and block_hash not in self.cached_blocks:
                block.block_hash = block_hash
                self.cached_blocks[block_hash] = block.block_id
        self.num_cached_blocks[request.request_id] = max(start, num_full)

    def free(self, request: "Request") -> None:
        """Drop the request's references. Its tail blocks go to the free list first, so that
        they are evicted before the prefix blocks that other requests are likelier to share."""
        self.num_cached_blocks.pop(request.request_id, None)
        for block_id in reversed(self.req_to_blocks.pop(request.request_id, [])):
            block = self.blocks[block_id]
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.free_blocks[block_id] = None

    def reset_prefix_cache(self) -> None:
        for block_id in self.free_blocks:
            self.blocks[block_id].block_hash = None
        self.cached_blocks = {h: b for h, b in self.cached_blocks.items()
                              if self.blocks[b].block_hash is not None}
