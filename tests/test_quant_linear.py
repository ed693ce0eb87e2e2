"""Linear layers on the GGUF's own blocks (quant_linear.py, csrc/quant_ops.c) give the numbers
of the float32 path on the dequantized weights.

The kernel is checked against gguf-py's own dequantizer for Q4_0, Q4_1 and Q8_0, at batch 1
and at batches past the few/many split, in both builds (-march=native and the AVX2-only
x86-64-v3); the tensor-parallel slices of the blocks against the whole matrix; and the bundled
Q4_1 model, run on its blocks (the default), against the same model with --quantization none
(dequantized to float32 at load): teacher-forced logits within LOGIT_RTOL and greedy tokens
equal under the near-tie rule.
"""

import os
import platform
import subprocess
import sys

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize
from test_decode_step_prompts import both_ways
from test_reference import QUESTIONS, greedy_chats
from tiny_model import assert_greedy_match

from minivllm.distributed.parallel_state import TPGroup
from minivllm.engine.config import EngineConfig
from minivllm.model import csrc_build, custom_ops, weight_arena
from minivllm.model.linear import Linear
from minivllm.model.quant_linear import (QuantColumnParallelLinear, QuantLinear, QuantLMHead,
                                         QuantRowParallelLinear, QuantWeight)
from minivllm.model.random_step import random_step

QTYPES = [GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q8_0]
# Measured here: the blocks and the dequantized float32 weights differ by at most 2.4e-6 of a
# position's largest logit (only the order of the additions differs); 1e-4 is the bar.
LOGIT_RTOL = 1e-4
NEAR_TIE = 1e-3
NUM_TOKENS = 24


def quantized(qtype, out_features, in_features, seed=0):
    """A random matrix in qtype's blocks and gguf-py's own dequantization of it."""
    w = np.random.default_rng(seed).standard_normal((out_features, in_features), np.float32)
    blocks = quantize(w, qtype)
    reference = torch.from_numpy(dequantize(blocks, qtype).reshape(w.shape).copy())
    return QuantWeight(torch.from_numpy(blocks.copy()), qtype, in_features), reference


def assert_matmul_close(out, x, w_float):
    ref = (x.double() @ w_float.double().t()).float()
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5 * float(ref.abs().max()))


@pytest.mark.parametrize("qtype", QTYPES, ids=lambda q: q.name)
def test_blocks_dequantize_as_gguf_does(qtype):
    w, reference = quantized(qtype, 70, 576)
    assert torch.equal(w.float(), reference)


@pytest.mark.parametrize("rows", [1, 5, 6, 16, 17, 33])  # 1-5: the GEMV; 6+: the GEMM
@pytest.mark.parametrize("qtype", QTYPES, ids=lambda q: q.name)
def test_c_and_torch_q_linear_match_the_dequantized_matmul(qtype, rows):
    w, reference = quantized(qtype, 70, 1536)  # 70 rows: a tile of 4 that is cut short
    x = torch.randn(rows, 1536)
    assert_matmul_close(custom_ops.q_linear_torch(x, w), x, reference)
    if csrc_build.load() is None:
        pytest.skip("the C ops are not built here")
    assert_matmul_close(custom_ops.q_linear_c(x, w), x, reference)


CHECK_BUILD = """
import torch
from tests.test_quant_linear import QTYPES, assert_matmul_close, quantized
from minivllm.model import csrc_build, custom_ops
assert csrc_build.load() is not None
for qtype in QTYPES:
    for rows in (1, 7, 32):
        w, reference = quantized(qtype, 37, 576)
        x = torch.randn(rows, 576)
        assert_matmul_close(custom_ops.q_linear_c(x, w), x, reference)
print("ok", csrc_build.build().name)
"""


def run_in_build(arch: str, script: str) -> list[str]:
    """The words script prints in a process whose C ops are built for MINIVLLM_CPU_ARCH=arch;
    fails the test where it fails."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, csrc_build.ARCH_ENV: arch,
           "PYTHONPATH": os.pathsep.join([root, os.path.join(root, "tests")])}
    done = subprocess.run([sys.executable, "-c", script], env=env, cwd=root,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.split()


@pytest.mark.skipif(platform.machine() != "x86_64", reason="x86-64-v3 is an x86 level")
def test_the_avx2_build_gives_the_same_numbers():
    """MINIVLLM_CPU_ARCH=x86-64-v3 compiles the kernel for an AVX2 CPU without AVX-512."""
    words = run_in_build("x86-64-v3", CHECK_BUILD)
    assert words[0] == "ok"
    assert words[1] != csrc_build.build().name  # a build of its own


def test_tensor_parallel_slices_of_blocks_add_up_to_the_whole_matrix():
    """Three ranks: column slices of fused parts stacked again, row slices (whole blocks of
    the input columns) summed, as the all-reduce would, give the unsharded product."""
    w, reference = quantized(GGMLQuantizationType.Q4_1, 96, 576)
    x, sizes = torch.randn(3, 576), [48, 24, 24]
    ranks = [TPGroup(rank=r, world_size=3) for r in range(3)]
    columns = [QuantColumnParallelLinear(w, tp, sizes)(x) for tp in ranks]
    by_part = [torch.cat([c.split([16, 8, 8], dim=1)[i] for c in columns], dim=1)
               for i in range(3)]
    assert_matmul_close(torch.cat(by_part, dim=1), x, reference)
    partial = [QuantLinear.__call__(QuantRowParallelLinear(w, tp), x.chunk(3, dim=1)[tp.rank])
               for tp in ranks]
    assert_matmul_close(sum(partial), x, reference)
    with pytest.raises(ValueError, match="whole blocks"):
        QuantRowParallelLinear(w, TPGroup(rank=0, world_size=5))


def test_the_head_on_blocks_gives_logits_and_embedding_rows_on_every_rank():
    """A Q8_0 table of 10 rows over 3 ranks (4, 4 and 2 rows plus 2 zero rows): each rank's
    logits are its rows of the whole product, each lookup its rows of the dequantized table."""
    w, reference = quantized(GGMLQuantizationType.Q8_0, 10, 64)
    x, ids = torch.randn(2, 64), torch.tensor([0, 5, 9])
    heads = [QuantLMHead(w, TPGroup(rank=r, world_size=3)) for r in range(3)]
    logits = torch.cat([head.linear(x) for head in heads], dim=1)
    assert_matmul_close(logits[:, :10], x, reference)
    assert torch.equal(logits[:, 10:], torch.zeros(2, 2))
    for head in heads:
        local = ids - head.start
        mine = (local >= 0) & (local < head.rows)
        assert torch.equal(head.lookup(local[mine]), reference[ids[mine]])


def test_an_unknown_quantization_is_refused():
    with pytest.raises(ValueError, match="use gguf"):
        EngineConfig(quantization="int3")


@pytest.fixture(scope="module")
def runs():
    """The bundled model on its blocks (the default) and with float32 weights (none), in this
    process: greedy tokens for the chat prompts, and the models to score with."""
    return greedy_chats({q: {"quantization": q} for q in (None, "none")}, NUM_TOKENS)


def test_the_default_keeps_the_blocks_and_none_dequantizes(runs):
    assert isinstance(runs[None][2].layers[0].down, QuantLinear)
    assert isinstance(runs[None][2].lm_head, QuantLMHead)  # the file's Q8_0 token_embd, tied
    lib = csrc_build.load()  # the Q4_1 layers packed where the kernels take it (repack)
    takes = lib is not None and lib.q_takes_packed(int(GGMLQuantizationType.Q4_1))
    assert runs[None][2].layers[0].down.weight.packed == bool(takes)
    assert runs[None][2].lm_head.linear.weight.packed == bool(takes)
    assert isinstance(runs["none"][2].layers[0].down, Linear)
    assert isinstance(runs["none"][2].lm_head.linear, Linear)


def test_the_layers_blocks_share_one_allocation_of_huge_page_size(runs):
    model = runs[None][2]
    mats = [m.weight.data for layer in model.layers
            for m in (layer.qkv, layer.o, layer.gate_up, layer.down)]
    storages = {m.untyped_storage().data_ptr() for m in mats}
    assert len(storages) == 1, f"{len(storages)} allocations for {len(mats)} matrices"
    assert mats[0].untyped_storage().nbytes() >= 2 << 20  # torch's line for huge pages
    starts = [m.data_ptr() for m in mats]
    assert starts == sorted(starts) and all(s % weight_arena.ALIGN == 0 for s in starts)
    assert model.lm_head.linear.weight.data.untyped_storage().data_ptr() not in storages


def test_gathered_tensors_keep_their_values_dtypes_and_shapes():
    tensors = [torch.arange(7, dtype=torch.uint8), torch.randn(3, 5),
               torch.arange(12, dtype=torch.int64).view(4, 3)[:, ::2]]  # a strided one too
    views = weight_arena.gather(tensors)
    assert len({v.untyped_storage().data_ptr() for v in views}) == 1
    for t, v in zip(tensors, views):
        assert v.dtype == t.dtype and v.shape == t.shape and v.is_contiguous()
        assert torch.equal(v, t) and v.data_ptr() % weight_arena.ALIGN == 0
    ends = [v.data_ptr() + v.nbytes for v in views]
    assert all(end <= nxt.data_ptr() for end, nxt in zip(ends, views[1:]))  # none overlap


def test_the_blocks_give_the_float32_paths_logits_and_tokens(runs):
    prompts, float_tokens, float_model = runs["none"]
    _, block_tokens, block_model = runs[None]
    for q, prompt, ref, ours in zip(QUESTIONS, prompts, float_tokens, block_tokens):
        sequence = [*prompt, *ref]  # both score the float path's tokens
        ref_logits, our_logits = float_model.score(sequence), block_model.score(sequence)
        scale = ref_logits.abs().amax(dim=1, keepdim=True)
        worst = float(((our_logits - ref_logits).abs() / scale).max())
        assert worst <= LOGIT_RTOL, f"{q!r}: logits differ by {worst:.3g} of their largest"
        chose = ref_logits[len(prompt) - 1:len(sequence) - 1]
        assert_greedy_match(ref, ours, chose, NEAR_TIE, repr(q))


def test_three_ranks_on_the_blocks_give_the_in_process_outputs():
    """The bundled GGUF on its blocks at TP=3 (worker processes, gloo all-reduce) against TP=1
    in process: greedy tokens under the near-tie rule, logits teacher-forced on TP=1's tokens."""
    from test_tp import run
    prompts = [np.arange(5, 5 + n, dtype=np.int32) * 7 for n in (4, 19, 33)]
    tokens1, scores1 = run(EngineConfig(quantization="gguf"), prompts)
    tokens3, scores3 = run(EngineConfig(quantization="gguf", tensor_parallel_size=3), prompts,
                           scored=tokens1)
    for p, ref, ours, s1, s3 in zip(prompts, tokens1, tokens3, scores1, scores3):
        s1, s3 = torch.as_tensor(s1), torch.as_tensor(s3)
        worst = float(((s3 - s1).abs() / s1.abs().amax(dim=1, keepdim=True)).max())
        assert worst <= LOGIT_RTOL, f"TP=3 logits differ by {worst:.3g} of their largest"
        assert_greedy_match(ref, ours, s1[len(p) - 1:-1], NEAR_TIE, f"prompt of {len(p)}")


def decode_batch(model, batch: int, block_size: int = 16):
    """A decode step for `batch` sequences of distinct lengths over a random cache."""
    lens = [9 + 13 * i for i in range(batch)]  # the new token included
    return random_step(model, lens, [], block_size, seed=batch)


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("batch", [1, 5, 6, 32])  # 1-5 rows: the GEMV; 6+: the GEMM
def test_the_decode_step_in_c_gives_the_op_by_op_hidden_states_and_cache(runs, c_ops, batch,
                                                                          kv_dtype, monkeypatch):
    """Also on a 16-bit cache (--kv-cache-dtype): the same rounding and widening either way."""
    model = runs[None][2]
    monkeypatch.setattr(model, "kv_cache_dtype", kv_dtype)  # decode_batch allocates the caches
    assert model.decode_step is not None, "the bundled GGUF on one rank should run its steps in C"
    ids, positions, caches, meta = decode_batch(model, batch)
    assert caches[0].dtype == kv_dtype
    hidden, written, reference, caches = both_ways(model, ids, positions, caches, meta)
    assert hidden is not None, "a step of decodes only ran op by op"
    assert torch.equal(hidden, reference), "the C loop's hidden states differ from the ops'"
    assert all(torch.equal(a, b) for a, b in zip(written, caches)), "the caches differ"
