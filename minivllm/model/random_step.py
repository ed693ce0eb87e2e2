"""One step's inputs over a random KV cache, with no engine around it: decodes and prompt chunks
of given lengths, their blocks scattered through the cache. scripts/mixed_step_bench.py times a
step's forward on them; tests/test_decode_step_prompts.py checks the C step against op by op."""

from __future__ import annotations

import torch

from minivllm.model import decode_step
from minivllm.model.attention import AttentionMetadata, PrefillChunk


def random_step(model, decode_lens, chunks, block_size: int = 16, seed: int = 1):
    """(ids, positions, caches, meta) for decodes of decode_lens tokens (the new one included)
    and then prompt chunks of (tokens, context): a chunk's context - tokens earlier tokens are
    already in the cache. Each sequence gets its own blocks, in a random order."""
    gen = torch.Generator().manual_seed(seed)
    needs = [-(-n // block_size) for n in decode_lens] + [-(-ctx // block_size) for _, ctx in chunks]
    caches = model.allocate_kv_cache(sum(needs), block_size)
    for cache in caches:
        cache.copy_(torch.randn(cache.shape, generator=gen))
    blocks = torch.randperm(sum(needs), generator=gen).split(needs)
    decodes = len(decode_lens)
    width = max(needs[:decodes], default=0)
    tables = torch.zeros(decodes, width, dtype=torch.int64)
    for row, ids in zip(tables, blocks[:decodes]):
        row[:len(ids)] = ids
    positions = [torch.tensor(decode_lens, dtype=torch.int64) - 1]
    meta = AttentionMetadata(slot_mapping=None, num_decodes=decodes, decode_block_tables=tables,
                             decode_seq_lens=torch.tensor(decode_lens, dtype=torch.int64))
    start = decodes
    for (tokens, ctx), ids in zip(chunks, blocks[decodes:]):
        positions.append(torch.arange(ctx - tokens, ctx))
        meta.prefills.append(PrefillChunk(start, start + tokens, ctx, ids))
        start += tokens
    positions = torch.cat(positions)
    rows = decode_step.row_block_tables(meta, start)
    meta.slot_mapping = (rows.gather(1, (positions // block_size)[:, None])[:, 0] * block_size
                         + positions % block_size)
    ids = torch.randint(100, model.config.vocab_size, (start,), generator=gen)
    return ids, positions, caches, meta
