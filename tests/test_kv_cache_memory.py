"""--kv-cache-memory-bytes (vLLM's flag): the KV cache sized from the budget, or from
max_num_seqs x max_model_len without one; one start-up line says what it holds; a budget too
small for one max_model_len sequence is refused with the size that would do."""

import argparse

import pytest

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
    block = per_block(tiny_dir)
    with pytest.raises(SystemExit, match="less than one sequence of max_model_len 512"):
        serve.main([tiny_dir, "--kv-cache-memory", str(4 * block), "--max-model-len", "512"])
    with ServerProcess([tiny_dir, "--kv-cache-memory-bytes", str(64 * block),
                        "--max-num-seqs", "2", "--max-model-len", "256"]) as server:
        output = server.output()
    assert (f"KV cache: 64 blocks of {BLOCK} tokens = 1,024 tokens" in output
            and "4.00 sequences of max_model_len 256 fit (max_num_seqs 2)" in output), output


def test_llm_takes_the_budget_and_allocates_that_cache(tiny_dir, monkeypatch):
    monkeypatch.setenv("MINIVLLM_ENABLE_V1_MULTIPROCESSING", "0")  # reach the worker's tensors
    block = per_block(tiny_dir)
    with LLM(tiny_dir, kv_cache_memory_bytes=24 * block) as llm:
        runner = llm.engine_core.engine_core.model_executor.driver_worker.model_runner
        allocated = sum(t.nbytes for t in runner.kv_caches)
        out = llm.generate([[5, 6, 7]], SamplingParams(temperature=0.0, max_tokens=4,
                                                       ignore_eos=True), use_tqdm=False)
    assert allocated == 24 * block
    assert len(out[0].outputs[0].token_ids) == 4
