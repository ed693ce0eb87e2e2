"""The one-call C step (decode_step.py) on a step with prompt chunks: each prompt token attends
as a decode of its own length, which must be the causal attention op by op computes with SDPA."""

import pytest
import torch

from minivllm.engine.config import EngineConfig
from minivllm.model import csrc_build, decode_step
from minivllm.model.random_step import random_step
from minivllm.worker.model_runner import ModelRunner

BS = 16
# Measured here on this batch: a row's hidden states differ by at most 1e-4 of the row's largest
# (2.9e-3 where that is ~30), the decodes' rows not at all: only the order of the additions in
# prompt attention differs, grown through 30 layers over a random cache. A wrong mask moves
# whole units.
RTOL = 1e-3


pytestmark = pytest.mark.usefixtures("c_ops")  # every op in C (conftest.py)


@pytest.fixture(scope="module")
def model():
    if csrc_build.load() is None:
        pytest.skip("the C ops are not built here")
    runner = ModelRunner(EngineConfig())
    runner.load_model()
    assert runner.model.decode_step is not None, "the bundled GGUF should run its steps in C"
    return runner.model


def mixed_batch(model, decode_lens=(9, 40, 23), chunks=((20, 20), (7, 37))):
    """Decodes of those lengths (the new token included), then prompt chunks (tokens, context):
    the second chunk's first 30 tokens are already in the cache. The cache is random."""
    return random_step(model, decode_lens, chunks, BS)


def both_ways(model, ids, positions, caches, meta):
    """The step in the C loop, then op by op from the same caches: (the C loop's hidden states,
    None where it declined the step; its caches; op by op's hidden states; its caches)."""
    before = [c.clone() for c in caches]
    step = model.decode_step
    with torch.inference_mode():
        hidden = step.run(model.embed_tokens(ids).contiguous(), positions, caches, meta)
        written = [c.clone() for c in caches]
        for cache, old in zip(caches, before):
            cache.copy_(old)
        model.decode_step = None
        try:
            reference = model.forward(ids, positions, caches, meta)
        finally:
            model.decode_step = step
    return hidden, written, reference, caches


def test_prompt_chunks_in_the_c_step_give_op_by_ops_hidden_states_and_cache(model):
    hidden, written, reference, caches = both_ways(model, *mixed_batch(model))
    assert hidden is not None, "a step with prompt chunks ran op by op"
    scale = reference.abs().amax(1, keepdim=True)
    worst = ((hidden - reference).abs() / scale).max().item()
    assert worst < RTOL, (f"the C step's hidden states differ from op by op's by {worst:.1e} of "
                          f"a row's largest")
    assert torch.equal(hidden[:3], reference[:3]), "the decodes' rows should be equal to the bit"
    for layer, (a, b) in enumerate(zip(written, caches)):
        assert torch.allclose(a, b, rtol=RTOL, atol=RTOL), f"layer {layer}'s cache differs"


def test_row_block_tables_give_each_prompt_token_its_chunks_table(model):
    _, _, _, meta = mixed_batch(model)
    tables = decode_step.row_block_tables(meta, 30)
    assert torch.equal(tables[:3, :3], meta.decode_block_tables)
    for chunk in meta.prefills:
        rows = tables[chunk.start:chunk.end, :len(chunk.block_ids)]
        assert torch.equal(rows, chunk.block_ids.expand_as(rows))


def test_long_prompt_contexts_and_ops_mode_run_op_by_op(model, monkeypatch):
    ids, positions, caches, meta = mixed_batch(model)
    x = model.embed_tokens(ids).contiguous()
    monkeypatch.setattr(decode_step, "MAX_PROMPT_CONTEXT", 36)  # the second chunk's is 37
    assert model.decode_step.run(x, positions, caches, meta) is None
    monkeypatch.setenv(decode_step.ENV, "ops")
    assert decode_step.DecodeStep.for_model(model) is None
