"""--kv-cache-memory-bytes (vLLM's flag): the KV cache sized from the budget, or from
max_num_seqs x max_model_len without one; one start-up line says what it holds; a budget too
small for one max_model_len sequence is refused with the size that would do.

--kv-cache-dtype (vLLM's flag): float16 or bfloat16 keys and values hold twice the tokens of
float32 in the same budget, and the bundled model's greedy tokens and logits barely move."""

import argparse
import platform
import subprocess
import sys

import openai
import pytest
import torch
from test_reference import QUESTIONS, greedy_chats
from tiny_model import assert_greedy_match

from minivllm import LLM
from minivllm.engine.config import DEFAULT_KV_CACHE_BYTES, EngineConfig
from minivllm.entrypoints import serve
from minivllm.entrypoints.openai.server_process import ServerProcess
from minivllm.sampling_params import SamplingParams
from minivllm.utils.byte_sizes import parse_bytes

BLOCK = 16


def per_block(tiny_dir: str) -> int:
    return BLOCK * EngineConfig(model=tiny_dir).kv_bytes_per_token


def test_byte_counts_read_as_vllm_reads_them():
    assert parse_bytes("4096") == 4096
    assert parse_bytes("512M") == 512 * 2**20 and parse_bytes("2G") == 2 * 2**30
    assert parse_bytes("1.5g") == 1_500_000_000 and parse_bytes("3k") == 3000
    for bad in ("1.5G", "ten", "1.5", "-3M"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_bytes(bad)


def test_the_budget_sets_the_blocks_and_max_model_len_is_checked_against_it(tiny_dir):
    block = per_block(tiny_dir)
    config = EngineConfig(model=tiny_dir, kv_cache_memory_bytes=40 * block + block // 2)
    assert config.num_kv_blocks == 40  # whole blocks only
    assert config.max_model_len == 40 * BLOCK  # the tiny model's 1024 does not fit: capped
    line = config.kv_cache_summary()
    assert f"40 blocks of {BLOCK} tokens = {40 * BLOCK} tokens" in line
    assert f"1.00 sequences of max_model_len {40 * BLOCK}" in line
    fits = EngineConfig(model=tiny_dir, kv_cache_memory_bytes=40 * block, max_model_len=160)
    assert fits.max_model_len == 160 and "4.00 sequences of max_model_len 160" in \
        fits.kv_cache_summary()
    with pytest.raises(ValueError, match=f"to at least {13 * block} or lower max_model_len "
                                         r"\(--max-model-len\) to 160"):
        EngineConfig(model=tiny_dir, kv_cache_memory_bytes=10 * block, max_model_len=200)
    with pytest.raises(ValueError, match="must be positive"):
        EngineConfig(model=tiny_dir, kv_cache_memory_bytes=0)


def test_without_a_budget_the_cache_holds_max_num_seqs_full_sequences(tiny_dir):
    config = EngineConfig(model=tiny_dir, max_num_seqs=3, max_model_len=100)
    assert config.num_kv_blocks == 3 * 7  # 100 tokens take 7 blocks of 16
    assert "3.36 sequences of max_model_len 100 fit (max_num_seqs 3)" in config.kv_cache_summary()
    # the default budget is the ceiling: the bundled model's 8192-token context x 64 is far more
    smol = EngineConfig()
    assert smol.num_kv_blocks == DEFAULT_KV_CACHE_BYTES // (BLOCK * smol.kv_bytes_per_token)


def test_serve_reports_the_cache_and_refuses_one_too_small(tiny_dir, capsys):
    """Served from a float16 cache: the budget of 64 float32 blocks holds 128."""
    block = per_block(tiny_dir)
    with pytest.raises(SystemExit, match="less than one sequence of max_model_len 512"):
        serve.main([tiny_dir, "--kv-cache-memory", str(4 * block), "--max-model-len", "512"])
    with ServerProcess([tiny_dir, "--kv-cache-memory-bytes", str(64 * block),
                        "--max-num-seqs", "2", "--max-model-len", "256",
                        "--kv-cache-dtype", "float16"]) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
        done = client.completions.create(model=tiny_dir, prompt="The capital of France is",
                                         max_tokens=5, temperature=0,
                                         extra_body={"ignore_eos": True})
        output = server.output()
    assert done.usage.completion_tokens == 5 and done.choices[0].text
    assert (f"KV cache: 128 blocks of {BLOCK} tokens = 2,048 tokens" in output
            and "in float16 (all ranks)" in output
            and "8.00 sequences of max_model_len 256 fit (max_num_seqs 2)" in output), output


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "float16", "bfloat16"])
def test_llm_takes_the_budget_and_allocates_that_cache(tiny_dir, monkeypatch, kv_cache_dtype):
    monkeypatch.setenv("MINIVLLM_ENABLE_V1_MULTIPROCESSING", "0")  # reach the worker's tensors
    block = per_block(tiny_dir)
    with LLM(tiny_dir, kv_cache_memory_bytes=24 * block, kv_cache_dtype=kv_cache_dtype) as llm:
        runner = llm.engine_core.engine_core.model_executor.driver_worker.model_runner
        allocated = sum(t.nbytes for t in runner.kv_caches)
        dtypes = {t.dtype for t in runner.kv_caches}
        out = llm.generate([[5, 6, 7]], SamplingParams(temperature=0.0, max_tokens=4,
                                                       ignore_eos=True), use_tqdm=False)
    assert allocated == 24 * block
    assert dtypes == {torch.float32 if kv_cache_dtype == "auto" else getattr(torch, kv_cache_dtype)}
    assert len(out[0].outputs[0].token_ids) == 4


@pytest.mark.parametrize("kv_cache_dtype", ["float16", "bfloat16"])
def test_a_16_bit_cache_holds_twice_the_tokens(tiny_dir, kv_cache_dtype):
    block = per_block(tiny_dir)
    config = EngineConfig(model=tiny_dir, kv_cache_dtype=kv_cache_dtype,
                          kv_cache_memory_bytes=40 * block)
    assert 2 * config.kv_bytes_per_token == EngineConfig(model=tiny_dir).kv_bytes_per_token
    assert config.num_kv_blocks == 80 and config.cache_dtype == kv_cache_dtype
    mib = 40 * block / 2**20  # the whole budget
    assert (f"80 blocks of {BLOCK} tokens = {80 * BLOCK:,} tokens, {mib:.1f} MiB in "
            f"{kv_cache_dtype} (all ranks)") in config.kv_cache_summary()


def test_the_cache_dtype_is_checked_and_named():
    for bad in ("fp8", "float32", "half"):  # vLLM's fp8 variants are not minivllm's
        with pytest.raises(ValueError, match="kv_cache_dtype must be one of auto, float16, "
                                             r"bfloat16 \(auto: the model's dtype\)"):
            EngineConfig(kv_cache_dtype=bad)
    # auto is the model's dtype; SmolLM2: 30 layers x 2 (k, v) x 3 kv heads x 64 x itemsize
    assert EngineConfig().kv_bytes_per_token == 30 * 2 * 3 * 64 * 4 == 46_080
    assert "in float32 (all ranks)" in EngineConfig().kv_cache_summary()
    assert "in bfloat16 (all ranks)" in EngineConfig(dtype="bfloat16").kv_cache_summary()
    assert EngineConfig(kv_cache_dtype="float16").kv_bytes_per_token == 23_040


# Measured here (the bundled model, six chat prompts, 24 greedy tokens each): a float16 cache
# moves a teacher-forced logit by at most 1.2e-3 of its position's largest (0.038 absolute);
# the bars leave about 2.5x room. A greedy flip needs a top-2 margin under twice that move.
F16_LOGIT_RTOL = 3e-3
F16_NEAR_TIE = 0.08


@pytest.fixture(scope="module")
def smol_by_cache():
    """The bundled model with a float32 and with a float16 KV cache, in this process: greedy
    tokens for the chat prompts, and the models to score with."""
    return greedy_chats({dtype: {"kv_cache_dtype": dtype} for dtype in ("auto", "float16")}, 24)


def test_a_float16_cache_keeps_the_bundled_models_tokens_and_logits(smol_by_cache):
    """Greedy decoding runs the C decode step on the float16 cache; scoring, the prefill path."""
    prompts, ref_tokens, ref_model = smol_by_cache["auto"]
    _, f16_tokens, f16_model = smol_by_cache["float16"]
    assert f16_model.kv_cache_dtype == torch.float16 and f16_model.decode_step is not None
    for q, prompt, ref, ours in zip(QUESTIONS, prompts, ref_tokens, f16_tokens):
        sequence = [*prompt, *ref]
        ref_logits, our_logits = ref_model.score(sequence), f16_model.score(sequence)
        worst = float(((our_logits - ref_logits).abs()
                       / ref_logits.abs().amax(dim=1, keepdim=True)).max())
        assert 0 < worst <= F16_LOGIT_RTOL, f"{q!r}: logits differ by {worst:.3g} of their largest"
        chose = ref_logits[len(prompt) - 1:len(sequence) - 1]
        assert_greedy_match(ref, ours, chose, F16_NEAR_TIE, repr(q))


HEAP_HOLES = """
from minivllm.utils.heap import trim_heap
def rss_mib():
    return int(next(l for l in open("/proc/self/status") if l.startswith("VmRSS")).split()[1]) >> 10
chunks, pins = [], []
for _ in range(2000):  # 64 KiB each, under glibc's mmap threshold: on the heap, touched
    chunks.append(bytearray(b"x") * 65536)
    pins.append(bytes(1024) + b"p")  # a live allocation after each: the holes cannot merge away
del chunks
before = rss_mib()
trimmed = trim_heap()
print(trimmed, before, rss_mib())
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_trim_heap_hands_freed_heap_pages_back():
    """125 MiB freed between live allocations stays resident until trim_heap (what
    Worker.load_model calls after a load); then it leaves the RSS."""
    out = subprocess.run([sys.executable, "-c", HEAP_HOLES], capture_output=True, text=True,
                         timeout=60, check=True).stdout.split()
    trimmed, before, after = out[0] == "True", int(out[1]), int(out[2])
    assert trimmed
    assert before - after > 80, f"RSS {before} MiB before malloc_trim, {after} MiB after"
