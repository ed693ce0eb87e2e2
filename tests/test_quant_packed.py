"""Packed Q4_0/Q4_1/Q8_0 rows (quant_linear.repack, csrc/quant_blocks.h): the same bytes, each row's
blocks in groups of 16 across the vector lanes, for the GEMV (csrc/quant_gemv.c).

Un-interleaving them in torch gives the file's bytes back; the kernels on packed rows give the
numbers of the same kernels on the file's rows (only the order of the additions differs), at
batches for the GEMV (1-5) and the GEMM, for K of whole groups (512, 1536), groups and a tail
of blocks (576, SmolLM2's hidden size) and a tail only (64); tensor-parallel slices are taken
from the file's layout and packed after; the output head, whose blocks also serve the embedding,
is packed too and its lookups still give the file's rows; and a build without AVX2 takes no packed
rows, so none are made.
"""

import platform

import pytest
import torch
from gguf import GGMLQuantizationType
from test_quant_linear import assert_matmul_close, quantized, run_in_build

from minivllm.distributed.parallel_state import TPGroup
from minivllm.model import csrc_build, custom_ops
from minivllm.model.quant_linear import (QuantColumnParallelLinear, QuantLinear, QuantLMHead,
                                         QuantRowParallelLinear, repack)

QTYPES = [GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q8_0]
WIDTHS = [576, 1536, 512, 64]


@pytest.fixture
def packing():
    """Skip where this build's kernels take no packed rows (no C ops, or no AVX2)."""
    lib = csrc_build.load()
    if lib is None or not lib.q_takes_packed(int(GGMLQuantizationType.Q4_1)):
        pytest.skip("this build of the C ops takes no packed rows")


@pytest.mark.parametrize("k", WIDTHS)
@pytest.mark.parametrize("qtype", QTYPES, ids=lambda q: q.name)
def test_packed_rows_unpack_to_the_files_bytes(packing, qtype, k):
    w, reference = quantized(qtype, 33, k)
    p = repack(w)
    assert p.packed and p.data.shape == w.data.shape
    assert torch.equal(p.data, w.data) == (k < 512)  # a row of fewer than 16 blocks stays
    assert torch.equal(p.blocks(), w.data)
    assert torch.equal(p.float(), reference)
    assert repack(p) is p


@pytest.mark.parametrize("rows", [1, 2, 5, 6, 33, 128])  # 1-5: the GEMV; 6+: the GEMM
@pytest.mark.parametrize("k", WIDTHS)
@pytest.mark.parametrize("qtype", QTYPES, ids=lambda q: q.name)
def test_q_linear_on_packed_rows_gives_the_files_rows_numbers(packing, qtype, k, rows):
    w, reference = quantized(qtype, 70, k, seed=k)
    p, x = repack(w), torch.randn(rows, k, generator=torch.Generator().manual_seed(rows))
    ours, theirs = custom_ops.q_linear_c(x, p), custom_ops.q_linear_c(x, w)
    # Only the order of the float32 additions differs, so each output may move by a few ulps of
    # the sum of its terms' sizes (at most 4.4 ulps, 5.2e-7, measured over 40 x's a case here;
    # an output compared with itself in size instead read 1.3e-4 once, where terms cancelled).
    assert ((ours - theirs).abs() <= 4e-6 * (x.abs() @ reference.abs().t())).all()
    assert_matmul_close(ours, x, reference)
    assert_matmul_close(custom_ops.q_linear_torch(x, p), x, reference)


def test_tensor_parallel_slices_are_packed_after_slicing(packing):
    """Three ranks over K = 1536: column slices of the whole rows, row slices of 512 input
    columns (one group each), each packed, add up to the unsharded product."""
    w, reference = quantized(GGMLQuantizationType.Q4_0, 48, 1536)
    x, ranks = torch.randn(2, 1536), [TPGroup(rank=r, world_size=3) for r in range(3)]
    columns = [QuantColumnParallelLinear(w, tp) for tp in ranks]
    rows = [QuantRowParallelLinear(w, tp) for tp in ranks]
    assert all(layer.weight.packed for layer in columns + rows)
    assert_matmul_close(torch.cat([layer(x) for layer in columns], dim=1), x, reference)
    partial = [QuantLinear.__call__(layer, x.chunk(3, dim=1)[layer.tp.rank]) for layer in rows]
    assert_matmul_close(sum(partial), x, reference)
    again = QuantRowParallelLinear(rows[0].weight, TPGroup(rank=1, world_size=2))  # from packed
    assert torch.equal(again.weight.blocks(), w.data.view(48, 48, 18)[:, 8:16].reshape(48, -1))


@pytest.mark.parametrize("ranks", [1, 3])
def test_the_head_is_packed_and_its_lookups_give_the_files_rows(packing, ranks):
    """The Q8_0 head of SmolLM2's GGUF (tied: the embedding too), 10 rows over 1 or 3 ranks
    (the last slice padded with zero rows): logits and looked-up rows as the file's blocks give."""
    w, reference = quantized(GGMLQuantizationType.Q8_0, 10, 576)
    x, rows = torch.randn(1, 576), -(-10 // ranks)
    for rank in range(ranks):
        head = QuantLMHead(w, TPGroup(rank=rank, world_size=ranks))
        assert head.linear.weight.packed and head.weight is head.linear.weight.data
        mine = reference[rank * rows:(rank + 1) * rows]
        assert_matmul_close(custom_ops.q_linear_c(x, head.linear.weight)[:, :len(mine)], x, mine)
        ids = torch.tensor([0, len(mine) - 1])
        assert torch.equal(head.lookup(ids), mine[ids])


CHECK_BUILD = """
import torch
from gguf import GGMLQuantizationType
from test_quant_linear import assert_matmul_close, quantized, run_in_build
from minivllm.model import csrc_build, custom_ops
from minivllm.model.quant_linear import repack
lib = csrc_build.load()
takes = bool(lib.q_takes_packed(int(GGMLQuantizationType.Q4_1)))
for qtype in (GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q8_0):
    for k in (576, 1536):
        w, reference = quantized(qtype, 37, k)
        p = repack(w)
        assert p.packed == takes
        for rows in (1, 3, 7, 32):
            x = torch.randn(rows, k)
            assert_matmul_close(custom_ops.q_linear_c(x, p), x, reference)
print("ok", takes)
"""


@pytest.mark.skipif(platform.machine() != "x86_64", reason="x86-64 levels")
@pytest.mark.parametrize("arch, takes", [("x86-64-v3", True), ("x86-64", False)])
def test_the_avx2_build_packs_and_the_plain_build_does_not(arch, takes):
    """MINIVLLM_CPU_ARCH: x86-64-v3 (AVX2, no AVX-512) runs packed rows on 8-lane halves;
    plain x86-64 has no vector GEMV, takes no packed rows, and the layers stay as they are."""
    assert run_in_build(arch, CHECK_BUILD) == ["ok", str(takes)]
