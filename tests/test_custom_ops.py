"""The C ops (csrc/cpu_ops.c) against their torch versions, and how they are built."""

import math
import shutil

import pytest
import torch
import torch.nn.functional as F
from tiny_model import make_tiny_model_dir

from minivllm.model import csrc_build, custom_ops
from minivllm.model.attention import AttentionMetadata, PrefillChunk, _decode_torch
from minivllm.model.kv_layout import key_blocks, value_blocks
from minivllm.model.llama import LlamaModel
from minivllm.model.loader import load_config, load_weights

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="no C compiler")


def _switch_to_torch_ops(monkeypatch):
    """From here on in the test, custom_ops runs its torch versions."""
    monkeypatch.setattr(csrc_build, "load", lambda: None)


def test_the_ops_build_and_load_here():
    assert csrc_build.load() is not None


@pytest.mark.parametrize("delta", [False, True])
@pytest.mark.parametrize("weight", [False, True])
def test_add_rms_norm(delta, weight):
    g = torch.Generator().manual_seed(2 * delta + weight)
    x = torch.randn(33, 96, generator=g)
    d = torch.randn(33, 96, generator=g) if delta else None
    w = torch.randn(96, generator=g) if weight else None
    ref_x = x + d if delta else x.clone()
    ref = F.rms_norm(ref_x, (96,), w, 1e-5)
    out = custom_ops.rms_norm(x, w, 1e-5, delta=d)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(x, ref_x)  # the residual stream was updated in place


def test_silu_and_mul_and_argmax():
    g = torch.Generator().manual_seed(0)
    gate_up = torch.randn(7, 2 * 130, generator=g) * 4
    ref = F.silu(gate_up[:, :130]) * gate_up[:, 130:]
    torch.testing.assert_close(custom_ops.silu_and_mul(gate_up), ref)
    logits = torch.randn(9, 5000, generator=g)
    logits[3, [10, 4000]] = 50.0  # a tie: the first index wins, as in torch
    assert torch.equal(custom_ops.argmax(logits), logits.argmax(-1))


@pytest.mark.parametrize("rows", range(1, 8))
def test_skinny_linear(rows):
    """Few rows times a weight, K both a multiple of the vector width and not (the tail)."""
    g = torch.Generator().manual_seed(rows)
    for n, k in ((960, 576), (10, 37)):
        x, w = torch.randn(rows, k, generator=g), torch.randn(n, k, generator=g)
        torch.testing.assert_close(custom_ops.skinny_linear(x, w), x @ w.t(), atol=1e-4, rtol=1e-4)
    assert custom_ops.skinny_linear(torch.randn(rows, 8), torch.randn(5, 8)) is None  # odd N
    assert custom_ops.skinny_linear(torch.randn(8, 8), torch.randn(4, 8)) is None  # 8 rows


def _random_cache(num_kv_heads, num_blocks, block_size, head_dim, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, num_kv_heads, num_blocks, block_size * head_dim, generator=g), g


@pytest.mark.parametrize("heads,kv_heads,head_dim,block_size",
                         [(9, 3, 64, 16), (4, 4, 32, 4), (8, 2, 16, 1), (6, 1, 128, 32),
                          (4, 2, 15, 3)])
def test_paged_decode_matches_the_torch_gather(heads, kv_heads, head_dim, block_size):
    """Ragged lengths, scattered block tables, stale data past each sequence's end."""
    cache, g = _random_cache(kv_heads, 64, block_size, head_dim, heads + block_size)
    lens = torch.tensor([1, 5, block_size, block_size + 1, 3 * block_size - 1])
    max_blocks = int(-(-lens.max() // block_size))
    tables = torch.randperm(64, generator=g)[:len(lens) * max_blocks].view(len(lens), -1)
    q = torch.randn(len(lens), heads, head_dim, generator=g)
    meta = AttentionMetadata(slot_mapping=torch.empty(0), num_decodes=len(lens),
                             decode_block_tables=tables, decode_seq_lens=lens)
    scale = 1 / math.sqrt(head_dim)
    out = custom_ops.paged_decode(q, cache, tables, lens, scale)
    assert out is not None
    torch.testing.assert_close(out, _decode_torch(q, cache, meta, scale), atol=1e-5, rtol=1e-5)


def test_paged_decode_declines_what_it_cannot_run():
    cache, _ = _random_cache(1, 4, 4, 8, 0)
    lens, tables = torch.tensor([3]), torch.tensor([[2]])
    assert custom_ops.paged_decode(torch.randn(1, 9, 8), cache, tables, lens, 1.0) is None  # G > 8
    bf16 = custom_ops.paged_decode(torch.randn(1, 2, 8).bfloat16(), cache.bfloat16(), tables,
                                   lens, 1.0)
    assert bf16 is None
    with pytest.raises(ValueError, match="longer than its block table"):
        custom_ops.paged_decode(torch.randn(1, 2, 8), cache, tables, torch.tensor([5]), 1.0)


def _rope_case(seed, head_dim):
    heads, kv_heads, block_size = 4, 2, 4
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(6, (heads + 2 * kv_heads) * head_dim, generator=g)
    positions = torch.tensor([0, 1, 2, 7, 8, 30])
    slots = torch.tensor([0, 1, 2, 13, 14, 21])
    cos, sin = torch.randn(32, head_dim, generator=g), torch.randn(32, head_dim, generator=g)
    cache = torch.zeros(2, kv_heads, 8, block_size * head_dim)
    return qkv, positions, cos, sin, heads, kv_heads, head_dim, cache, slots


@pytest.mark.parametrize("head_dim", [16, 260])  # 260: past the C op's limit, torch does it
def test_rope_and_cache_matches_torch(monkeypatch, head_dim):
    c_args, torch_args = _rope_case(1, head_dim), _rope_case(1, head_dim)
    custom_ops.rope_and_cache(*c_args)
    _switch_to_torch_ops(monkeypatch)
    custom_ops.rope_and_cache(*torch_args)
    torch.testing.assert_close(c_args[0], torch_args[0])  # q and k rotated in place, v as is
    torch.testing.assert_close(c_args[-2], torch_args[-2])  # the same cache
    d = head_dim  # the keys really are stored transposed in their block:
    torch.testing.assert_close(key_blocks(c_args[-2], d)[1, 13 // 4, :, 13 % 4],
                               c_args[0][3, 5 * d:6 * d])  # token 3's key, kv head 1
    v = value_blocks(c_args[-2], d)[0, 21 // 4, 21 % 4]  # token 5's value, kv head 0
    torch.testing.assert_close(v, c_args[0][5, 6 * d:7 * d])


def test_model_logits_are_the_same_with_c_and_torch_ops(tmp_path, monkeypatch):
    """A mixed step through the tiny model: the C ops change no logit beyond rounding."""
    d = make_tiny_model_dir(str(tmp_path))
    config = load_config(d)
    model = LlamaModel(config, load_weights(d, config))
    bs = 4

    def run():
        cache = model.allocate_kv_cache(16, bs)
        prompt = PrefillChunk(0, 10, 10, torch.arange(3))
        meta = AttentionMetadata(slot_mapping=torch.arange(10), prefills=[prompt])
        with torch.inference_mode():
            model.forward(torch.arange(3, 13), torch.arange(10), cache, meta)
            meta = AttentionMetadata(slot_mapping=torch.tensor([10]), num_decodes=1,
                                     decode_block_tables=torch.arange(3)[None],
                                     decode_seq_lens=torch.tensor([11]))
            return model.compute_logits(model.forward(torch.tensor([40]), torch.tensor([10]),
                                                      cache, meta))

    with_c = run()
    _switch_to_torch_ops(monkeypatch)
    torch.testing.assert_close(with_c, run(), atol=1e-4, rtol=1e-4)


def test_build_caches_by_source_and_reports_compiler_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIVLLM_CACHE_DIR", str(tmp_path))
    first = csrc_build.build()
    assert first.parent == tmp_path / "kernels" and first.exists()
    stamp = first.stat().st_mtime_ns
    assert csrc_build.build() == first and first.stat().st_mtime_ns == stamp  # no rebuild
    bad = tmp_path / "bad.c"
    bad.write_text("int f( {\n")
    monkeypatch.setattr(csrc_build, "SOURCE", bad)
    with pytest.raises(csrc_build.KernelBuildError, match="error"):
        csrc_build.build()
    with pytest.raises(csrc_build.KernelBuildError, match="no C compiler"):
        csrc_build.build(compiler="no-such-cc")
    assert [p.name for p in (tmp_path / "kernels").iterdir()] == [first.name]  # no temp left


def test_custom_ops_env_switches_to_torch(monkeypatch):
    monkeypatch.setenv(csrc_build.ENABLE_ENV, "torch")
    csrc_build.load.cache_clear()
    try:
        assert csrc_build.load() is None
        x = torch.randn(3, 8)
        torch.testing.assert_close(custom_ops.rms_norm(x, None, 1e-6),
                                   F.rms_norm(x, (8,), None, 1e-6))
    finally:
        monkeypatch.delenv(csrc_build.ENABLE_ENV)
        csrc_build.load.cache_clear()
