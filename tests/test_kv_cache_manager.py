"""The block allocator and prefix caching by chained block hashes."""

import numpy as np

from minivllm.engine.kv_cache_manager import KVCacheManager
from minivllm.engine.request import Request
from minivllm.sampling_params import SamplingParams

BS = 4


def req(rid, tokens):
    return Request(rid, np.array(tokens, np.int32), SamplingParams(), eos_token_id=None,
                   block_size=BS)


def admit(kv, r):
    """What the scheduler does for a waiting request: reuse hits, allocate the rest."""
    hits = kv.get_computed_blocks(r)
    r.num_computed_tokens = 0
    assert kv.allocate_slots(r, r.num_tokens - len(hits) * BS, hits)
    r.num_computed_tokens = r.num_tokens
    return hits


def test_allocate_and_free_return_every_block():
    kv = KVCacheManager(num_blocks=8, block_size=BS)
    a = req("a", range(10))
    admit(kv, a)
    assert len(kv.get_block_ids("a")) == 3 and kv.num_free_blocks == 5
    assert kv.allocate_slots(a, 2)  # 12 tokens still fit in 3 blocks
    assert len(kv.get_block_ids("a")) == 3
    assert kv.allocate_slots(a, 3)  # 15 tokens: a fourth block
    assert len(kv.get_block_ids("a")) == 4
    kv.free(a)
    assert kv.num_free_blocks == 8


def test_allocation_that_does_not_fit_changes_nothing():
    kv = KVCacheManager(num_blocks=3, block_size=BS)
    a = req("a", range(20))
    assert not kv.allocate_slots(a, 20)
    assert kv.num_free_blocks == 3 and kv.get_block_ids("a") == []


def test_prefix_hit_needs_the_whole_prefix():
    kv = KVCacheManager(num_blocks=16, block_size=BS)
    a = req("a", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
    admit(kv, a)
    kv.free(a)
    same = req("b", [1, 2, 3, 4, 5, 6, 7, 8, 99])
    assert len(kv.get_computed_blocks(same)) == 2
    second_differs = req("c", [1, 2, 3, 4, 0, 6, 7, 8, 9, 10])
    assert len(kv.get_computed_blocks(second_differs)) == 1
    first_differs = req("d", [0, 2, 3, 4, 5, 6, 7, 8, 9, 10])  # block 2 equal, prefix not
    assert kv.get_computed_blocks(first_differs) == []


def test_hits_are_shared_and_leave_one_token_to_compute():
    kv = KVCacheManager(num_blocks=16, block_size=BS)
    a = req("a", range(8))
    admit(kv, a)
    b = req("b", range(8))  # the whole prompt is cached, but its last token must be computed
    hits = admit(kv, b)
    assert len(hits) == 1 and kv.get_block_ids("b")[0] == kv.get_block_ids("a")[0]
    assert kv.blocks[hits[0]].ref_cnt == 2
    kv.free(a)
    assert kv.blocks[hits[0]].ref_cnt == 1


def test_prefix_caching_off_never_hits():
    kv = KVCacheManager(num_blocks=16, block_size=BS, enable_caching=False)
    a = req("a", range(12))
    admit(kv, a)
    kv.free(a)
    assert kv.get_computed_blocks(req("b", range(12))) == []


def test_eviction_takes_the_oldest_free_block_and_drops_its_hash():
    kv = KVCacheManager(num_blocks=4, block_size=BS)
    a = req("a", range(9))  # 2 full blocks cached + 1 partial
    admit(kv, a)
    kv.free(a)
    assert len(kv.get_computed_blocks(req("x", range(9)))) == 2
    b = req("b", range(100, 113))  # needs all 4 blocks: every cached block is evicted
    admit(kv, b)
    assert kv.cached_blocks.keys() == {h for h in b.block_hashes[:3]}
    kv.free(b)
    assert kv.get_computed_blocks(req("y", range(9))) == []


def test_freed_tail_blocks_are_evicted_before_the_prefix():
    kv = KVCacheManager(num_blocks=4, block_size=BS)
    a = req("a", range(12))
    admit(kv, a)
    kv.free(a)
    c = req("c", range(50, 54))  # one block: takes a's tail block, not its first
    admit(kv, c)
    assert len(kv.get_computed_blocks(req("z", range(12)))) == 2
