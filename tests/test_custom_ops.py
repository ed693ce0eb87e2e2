"""The C ops (csrc/cpu_ops.c) against their torch versions, and how they are built."""

import json
import math
import os
import shutil
import subprocess
import sys
import time

import pytest
import torch
import torch.nn.functional as F
from tiny_model import make_tiny_model_dir

from minivllm.model import csrc_build, custom_ops, op_choice, op_selection
from minivllm.model.attention import AttentionMetadata, PrefillChunk, decode_torch
from minivllm.model.kv_layout import key_blocks, value_blocks
from minivllm.model.llama import LlamaModel
from minivllm.model.loader import load_config, load_weights

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="no C compiler")


@pytest.fixture(autouse=True)
def c_ops(monkeypatch):
    """Every op in C, whatever this CPU measured faster: these tests compare C with torch."""
    monkeypatch.setattr(op_choice, "_table", dict.fromkeys(op_choice.OPS, "c"))


def _switch_to_torch_ops(monkeypatch):
    """From here on in the test, custom_ops runs its torch versions."""
    monkeypatch.setattr(op_choice, "_table", dict.fromkeys(op_choice.OPS, "torch"))


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
        torch.testing.assert_close(custom_ops.skinny_linear_c(x, w), x @ w.t(), atol=1e-4, rtol=1e-4)
    assert custom_ops.skinny_linear_c(torch.randn(rows, 8), torch.randn(5, 8)) is None  # odd N
    assert custom_ops.skinny_linear_c(torch.randn(8, 8), torch.randn(4, 8)) is None  # 8 rows


KV_DTYPES = [torch.float32, torch.float16, torch.bfloat16]  # --kv-cache-dtype auto, float16, ...


def _random_cache(num_kv_heads, num_blocks, block_size, head_dim, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    shape = (2, num_kv_heads, num_blocks, block_size * head_dim)
    return torch.randn(shape, generator=g).to(dtype), g


def _check_paged_decode(heads, kv_heads, head_dim, block_size, kv_dtype):
    """Ragged lengths, scattered block tables, stale data past each sequence's end; the cache
    in kv_dtype, widened to float32 as it is read (C and torch: the same tolerance)."""
    cache, g = _random_cache(kv_heads, 64, block_size, head_dim, heads + block_size, kv_dtype)
    lens = torch.tensor([1, 5, block_size, block_size + 1, 3 * block_size - 1])
    max_blocks = int(-(-lens.max() // block_size))
    tables = torch.randperm(64, generator=g)[:len(lens) * max_blocks].view(len(lens), -1)
    q = torch.randn(len(lens), heads, head_dim, generator=g)
    meta = AttentionMetadata(slot_mapping=torch.empty(0), num_decodes=len(lens),
                             decode_block_tables=tables, decode_seq_lens=lens)
    scale = 1 / math.sqrt(head_dim)
    out = custom_ops.paged_decode_c(q, cache, tables, lens, scale)
    assert out is not None
    torch.testing.assert_close(out, decode_torch(q, cache, meta, scale), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kv_dtype", KV_DTYPES, ids=str)
@pytest.mark.parametrize("heads,kv_heads,head_dim,block_size",
                         [(9, 3, 64, 16), (4, 4, 32, 4), (8, 2, 16, 1), (6, 1, 128, 32),
                          (4, 2, 15, 3)])
def test_paged_decode_matches_the_torch_gather(heads, kv_heads, head_dim, block_size, kv_dtype):
    _check_paged_decode(heads, kv_heads, head_dim, block_size, kv_dtype)


def test_paged_decode_declines_what_it_cannot_run():
    cache, _ = _random_cache(1, 4, 4, 8, 0)
    lens, tables = torch.tensor([3]), torch.tensor([[2]])
    assert custom_ops.paged_decode_c(torch.randn(1, 9, 8), cache, tables, lens, 1.0) is None  # G > 8
    bf16 = custom_ops.paged_decode_c(torch.randn(1, 2, 8).bfloat16(), cache.bfloat16(), tables,
                                   lens, 1.0)
    assert bf16 is None
    float64_cache = cache.double()  # not a KV cache dtype
    assert custom_ops.paged_decode_c(torch.randn(1, 2, 8), float64_cache, tables, lens, 1.0) is None
    with pytest.raises(ValueError, match="longer than its block table"):
        custom_ops.paged_decode_c(torch.randn(1, 2, 8), cache, tables, torch.tensor([5]), 1.0)


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


# Values that test the rounding: float16 and bfloat16 ties (to even), float16 subnormals and
# its overflow, float32 subnormals (bfloat16 keeps them), the largest floats, infinities, NaN.
ROUNDING_CASES = [1 + 2**-11, 1 + 3 * 2**-11, 1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 2**-25,
                  3 * 2**-26, 1e-6, 6e-5, 65504.0, 65519.99, 65520.0, 1e5, 1e-40, 3.4e38, -0.0,
                  float("inf"), float("-inf"), float("nan")]


@pytest.mark.parametrize("kv_dtype", KV_DTYPES, ids=str)
def test_rope_and_cache_writes_the_torch_paths_bits(monkeypatch, kv_dtype):
    """The C op's rounding to the cache's dtype is torch's `.to(dtype)`, to the bit. RoPE is
    the identity here (cos 1, sin 0), so both paths round the same float32 keys and values."""
    qkv, positions, _, _, heads, kv_heads, d, cache, slots = _rope_case(3, 32)
    qkv[:, heads * d:] *= 100  # spread over many exponents
    finite = [x for x in ROUNDING_CASES if math.isfinite(x)]  # inf * sin 0 would be NaN
    qkv[0, heads * d:heads * d + len(finite)] = torch.tensor(finite)  # a key head
    qkv[1, (heads + kv_heads) * d:][:len(ROUNDING_CASES)] = torch.tensor(ROUNDING_CASES)  # a value
    cos, sin = torch.ones(32, d), torch.zeros(32, d)
    caches = []
    for ops in ("c", "torch"):
        monkeypatch.setattr(op_choice, "_table", dict.fromkeys(op_choice.OPS, ops))
        caches.append(cache.to(kv_dtype))
        custom_ops.rope_and_cache(qkv.clone(), positions, cos, sin, heads, kv_heads, d,
                                  caches[-1], slots)
    c_cache, torch_cache = caches
    nan = torch_cache.isnan()
    assert nan.any() and torch.equal(c_cache.isnan(), nan)  # NaN stays NaN (its bits may vary)
    bits = {torch.float32: torch.int32}.get(kv_dtype, torch.int16)
    assert torch.equal(c_cache.view(bits)[~nan], torch_cache.view(bits)[~nan])


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
    monkeypatch.setattr(csrc_build, "SOURCES", [csrc_build.SOURCES[0], bad])
    with pytest.raises(csrc_build.KernelBuildError, match="error"):
        csrc_build.build()
    with pytest.raises(csrc_build.KernelBuildError, match="no C compiler"):
        csrc_build.build(compiler="no-such-cc")
    assert [p.name for p in (tmp_path / "kernels").iterdir()] == [first.name]  # no temp left


@pytest.fixture
def fresh_load(monkeypatch):
    """csrc_build.load() and the op choice resolved again under the test's environment, and
    again after it."""
    csrc_build.load.cache_clear()
    monkeypatch.setattr(op_choice, "_table", op_choice.table())
    yield
    csrc_build.load.cache_clear()


def test_custom_ops_env_switches_to_torch(monkeypatch, fresh_load):
    monkeypatch.setenv(csrc_build.ENABLE_ENV, "torch")
    assert csrc_build.load() is None
    assert set(op_selection.resolve().values()) == {"torch"}
    op_choice.set_table(op_selection.resolve())
    x = torch.randn(3, 8)
    torch.testing.assert_close(custom_ops.rms_norm(x, None, 1e-6),
                               F.rms_norm(x, (8,), None, 1e-6))
    monkeypatch.setenv(csrc_build.ENABLE_ENV, "c")
    csrc_build.load.cache_clear()  # load() read the environment once, as a process does
    assert set(op_selection.resolve().values()) == {"c"}
    monkeypatch.setenv(csrc_build.ENABLE_ENV, "fast")
    with pytest.raises(ValueError, match="use auto, c or torch"):
        op_selection.resolve()


def test_selection_keeps_the_faster_version():
    def fast():  # a few microseconds on one thread: no thread pool a neighbour can stall
        return sum(range(50))

    def slow():
        time.sleep(0.005)  # a thousand times longer
        return fast()

    kept = op_selection.faster(fast, slow)
    assert kept["choice"] == "c" and kept["c_speedup"] > 1 and kept["c_us"] < kept["torch_us"]
    dropped = op_selection.faster(slow, fast)
    assert dropped["choice"] == "torch" and dropped["c_speedup"] < 1


def test_the_choice_is_measured_once_and_cached_with_the_build(tmp_path, monkeypatch, fresh_load):
    monkeypatch.setenv("MINIVLLM_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(op_selection, "BUDGET_S", 0.0)  # the fewest rounds: this is no benchmark
    ops = op_selection.load_or_measure()
    path = op_selection.choice_file()
    assert path.parent == csrc_build.build().parent and set(ops) == set(op_choice.OPS)
    assert all(row["choice"] in ("c", "torch", "mm") and row["c_us"] > 0 for row in ops.values())
    # the file decides, not a new measurement: flip every choice and read them back
    flipped = {key: dict(row, choice="c" if row["choice"] == "torch" else "torch")
               for key, row in ops.items()}
    record = {"threads": torch.get_num_threads(), "load_average": 0.0, "ops": flipped}
    path.write_text(json.dumps(record))
    assert op_selection.resolve() == {key: row["choice"] for key, row in flipped.items()}
    op_selection.prepare(torch.float32)  # what a model load does: the table follows the file
    assert op_choice.table() == op_selection.resolve()
    assert op_choice.runs_in_c("skinny_linear", 1) == (flipped["skinny_linear/few"]["choice"] == "c")
    assert not op_choice.runs_in_c("skinny_linear", 8)  # never C past 7 rows
    # timed on an oversubscribed machine that is quiet now: timed again
    monkeypatch.setattr(os, "getloadavg", lambda: (0.5, 0.5, 0.5))
    path.write_text(json.dumps(dict(record, load_average=4.0 * (os.cpu_count() or 1))))
    op_selection.load_or_measure()
    assert json.loads(path.read_text())["load_average"] == 0.5  # written by a new measurement
    path.write_text("{not json")  # a damaged file is measured again, not trusted
    assert set(op_selection.load_or_measure()) == set(op_choice.OPS)
    assert json.loads(path.read_text())["threads"] == torch.get_num_threads()


def test_an_avx2_build_has_no_avx512_and_gives_the_same_results(tmp_path, monkeypatch,
                                                                 fresh_load):
    """MINIVLLM_CPU_ARCH=x86-64-v3: the ops as an AVX2-only CPU builds them (32-byte vectors)."""
    monkeypatch.setenv("MINIVLLM_CACHE_DIR", str(tmp_path))
    native = csrc_build.build()
    monkeypatch.setenv(csrc_build.ARCH_ENV, "x86-64-v3")
    avx2 = csrc_build.build()
    assert avx2 != native
    if shutil.which("objdump"):
        code = subprocess.run(["objdump", "-d", str(avx2)], capture_output=True, text=True).stdout
        assert "ymm" in code and "zmm" not in code
        assert "vcvtph2ps" in code  # a float16 cache read a vector at a time (F16C)
    monkeypatch.setattr(op_choice, "_table", dict.fromkeys(op_choice.OPS, "c"))
    assert csrc_build.load()._name == str(avx2)
    g = torch.Generator().manual_seed(0)
    for rows in (1, 3, 7):
        for n, k in ((960, 576), (10, 37)):
            x, w = torch.randn(rows, k, generator=g), torch.randn(n, k, generator=g)
            torch.testing.assert_close(custom_ops.skinny_linear_c(x, w), x @ w.t(),
                                       atol=1e-4, rtol=1e-4)
    for kv_dtype in KV_DTYPES:  # SmolLM2's attention shape, and one the vectors do not fit
        _check_paged_decode(9, 3, 64, 16, kv_dtype)
        _check_paged_decode(4, 2, 15, 3, kv_dtype)
    monkeypatch.setenv(csrc_build.ARCH_ENV, "native -O0")
    with pytest.raises(csrc_build.KernelBuildError, match="not a -march name"):
        csrc_build.build()


BF16_LOAD = """
import json, sys, warnings
import minivllm, torch
from minivllm.model.llama import LlamaModel
from minivllm.model.loader import load_config, load_weights
config = load_config(sys.argv[1])
weights = load_weights(sys.argv[1], config)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for _ in range(2):
        LlamaModel(config, weights, torch.bfloat16)
print(json.dumps([str(w.message) for w in caught if "bfloat16" in str(w.message)]))
"""


@pytest.mark.parametrize("arch", ["native", "x86-64-v3"])
def test_a_bfloat16_model_warns_once_where_bfloat16_is_emulated(tmp_path, arch):
    """Loaded twice in a fresh process (torch's ISA is fixed at its start): x86-64-v3 holds
    oneDNN to AVX2, so bfloat16 is emulated there whatever this CPU has."""
    from minivllm.model import cpu_features
    env = dict(os.environ, MINIVLLM_CPU_ARCH=arch, MINIVLLM_CACHE_DIR=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", BF16_LOAD, make_tiny_model_dir(str(tmp_path))],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    warned = json.loads(done.stdout.splitlines()[-1])
    if arch == "native" and cpu_features.bf16_missing() is None:
        assert warned == []
    else:
        assert len(warned) == 1, warned
        assert "bfloat16 is emulated on this CPU" in warned[0]
        assert "slower than in float32" in warned[0]


def test_an_op_call_starts_no_timing_and_timing_flips_no_global(monkeypatch):
    """The choice is a table the model sets at load: calling an op before any load runs torch
    and measures nothing, and measuring leaves the table as it was."""
    code = ("import sys, torch\nfrom minivllm.model import custom_ops, op_choice\n"
            "custom_ops.rms_norm(torch.randn(2, 8), None, 1e-6)\n"
            "print('minivllm.model.op_selection' in sys.modules, set(op_choice.table().values()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split(None, 1) == ["False", "{'torch'}\n"], out.stdout
    monkeypatch.setattr(op_selection, "BUDGET_S", 0.0)
    before = op_choice.set_table({key: "c" if i % 2 else "torch" for i, key in enumerate(op_choice.OPS)})
    try:
        mixed = op_choice.table()
        op_selection.measure()
        assert op_choice.table() == mixed
    finally:
        op_choice.set_table(before)
