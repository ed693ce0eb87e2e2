"""`minivllm bench throughput`: offline decode tok/s of the in-process engine, next to this
machine's two limits, measured in the same run.

- Batch 1 reads every weight once per token: its limit is memory bandwidth / weight bytes.
- Batch 32 does 2 FLOPs per weight per token: its limit is matmul FLOP/s / (2 x weights).

Each row: the engine (EngineCore.step: scheduler, runner, sampler) and the model alone
(forward + logits on the same shapes), the in-process baseline later chapters compare against.
"""

from __future__ import annotations

import resource
import statistics
import time

import numpy as np
import torch
from tqdm.auto import tqdm

from minivllm.bench.common import (bench_parser, median_time, print_table, quick_mode,
                                   write_json)
from minivllm.engine.config import EngineConfig
from minivllm.engine.core import EngineCore
from minivllm.engine.messages import EngineCoreRequest
from minivllm.model.attention import AttentionMetadata
from minivllm.model.linear import onednn_linear, onednn_pack
from minivllm.sampling_params import SamplingParams

PROMPT_LEN = 64  # tokens of context each sequence has when decode timing starts
BANDWIDTH_BYTES = 256 * 2**20  # far larger than the L3 cache, like the weights
WARMUP_STEPS = 2  # the first steps fault in KV cache pages and start the thread pool
MATMUL_N = 2048  # a square matmul this size runs near the peak FLOP/s of the BLAS


def measure_bandwidth(repeats: int) -> float:
    """Read bandwidth in bytes/s: a sum over a buffer much larger than the caches. A limit is
    the best the machine does (noise only lowers it), so take the fastest of the repeats."""
    buf = torch.ones(BANDWIDTH_BYTES // 4)
    return BANDWIDTH_BYTES / _times(lambda: buf.sum(), repeats)[0]


def measure_matmul(dtype: torch.dtype, repeats: int) -> float:
    """FLOP/s of a large square matmul, the best of MKL (`a @ b`) and oneDNN with a prepacked
    weight (the kernel the model uses for many rows): the limit is what the machine can do."""
    a, b = torch.randn(MATMUL_N, MATMUL_N, dtype=dtype), torch.randn(MATMUL_N, MATMUL_N, dtype=dtype)
    kernels = [lambda: a @ b]
    packed = onednn_pack(b.t())  # a @ b == a @ (b^T)^T: b^T is the (out, in) weight
    if packed is not None:
        kernels.append(lambda: onednn_linear(a, packed))
    return max(2 * MATMUL_N ** 3 / _times(k, repeats)[0] for k in kernels)


def _times(fn, repeats: int) -> list[float]:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)


def engine_decode(core: EngineCore, batch: int, steps: int, tag: str) -> float:
    """Decode tok/s through EngineCore.step() once every sequence is past its prompt, from the
    median step time, as the model row is timed: on a shared machine a few steps take a
    neighbour's hit, and a mean would charge those to the engine."""
    rng = np.random.default_rng(batch)
    vocab = core.config.model_config.vocab_size
    params = SamplingParams(temperature=0.0, max_tokens=steps + WARMUP_STEPS + 1, ignore_eos=True)
    for i in range(batch):
        prompt = rng.integers(100, vocab, PROMPT_LEN, dtype=np.int32)
        core.add_request(EngineCoreRequest(f"{tag}-{i}", prompt, params))
    while any(r.num_output_tokens < WARMUP_STEPS for r in core.scheduler.requests.values()):
        core.step()  # prefill, then a few untimed decode steps
    step_time = median_time(core.step, steps)
    while core.has_unfinished_requests():
        core.step()
    return batch / step_time


def model_decode(core: EngineCore, batch: int, steps: int) -> float:
    """The model alone: forward + logits for `batch` decode tokens over PROMPT_LEN of context."""
    runner = core.model_executor.driver_worker.model_runner
    model, bs = runner.model, core.config.block_size
    blocks = -(-(PROMPT_LEN + 1) // bs)
    tables = torch.arange(batch * blocks).view(batch, blocks)
    slots = tables[:, PROMPT_LEN // bs] * bs + PROMPT_LEN % bs
    meta = AttentionMetadata(slot_mapping=slots, num_decodes=batch, decode_block_tables=tables,
                             decode_seq_lens=torch.full((batch,), PROMPT_LEN + 1))
    ids, pos = torch.full((batch,), 1000), torch.full((batch,), PROMPT_LEN)

    def step() -> None:
        with torch.inference_mode():
            model.compute_logits(model.forward(ids, pos, runner.kv_caches, meta)).argmax(-1)
    step()  # warm-up, as _times does for the limits
    return batch / median_time(step, steps)


def measure_row(core: EngineCore, dtype: str, batch: int, steps: int, repeats: int,
                rounds: int) -> dict:
    """Engine and model tok/s for one batch, each round next to a fresh reading of both limits.

    The machine's speed drifts (neighbours, memory phases), so each ratio is taken within a
    round, between measurements seconds apart, and the row reports the median over rounds.
    """
    cfg = core.config
    torch_dtype = cfg.torch_dtype
    weight_bytes = cfg.model_config.num_params * torch.empty(0, dtype=torch_dtype).element_size()
    flops_per_token = 2 * cfg.model_config.num_params
    samples = []
    for r in range(rounds):
        bandwidth, flops = measure_bandwidth(repeats), measure_matmul(torch_dtype, repeats)
        engine = engine_decode(core, batch, steps, f"{dtype}-{batch}-{r}")
        samples.append({"engine_tok_s": engine, "model_tok_s": model_decode(core, batch, steps),
                        "bandwidth_GB_s": bandwidth / 1e9, "matmul_GFLOP_s": flops / 1e9,
                        "vs_bandwidth_limit": engine * weight_bytes / bandwidth,
                        "vs_matmul_limit": engine * flops_per_token / flops})
    row = {"dtype": dtype, "batch": batch, "rounds": rounds}
    row.update({k: statistics.median(s[k] for s in samples) for k in samples[0]})
    return row


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser("throughput", __doc__.splitlines()[0])
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--batches", default="1,8,32")
    args = parser.parse_args(argv)
    quick = args.quick or quick_mode()
    steps, repeats, rounds = (4, 3, 1) if quick else (24, 5, 3)
    batches = [int(b) for b in args.batches.split(",")]
    dtypes = args.dtypes.split(",")
    results, ratios = [], {}
    bar = tqdm(total=len(dtypes) * len(batches), desc="throughput", unit="row")
    for dtype in dtypes:
        config = EngineConfig(dtype=dtype, max_num_batched_tokens=max(batches) * PROMPT_LEN)
        core = EngineCore(config)
        for batch in batches:
            results.append(measure_row(core, dtype, batch, steps, repeats, rounds))
            bar.update(1)
        core.shutdown()
        del core
    bar.close()
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10
    print_table(results, ["dtype", "batch", "engine_tok_s", "model_tok_s", "bandwidth_GB_s",
                          "matmul_GFLOP_s", "vs_bandwidth_limit", "vs_matmul_limit", "rounds"])
    print("each ratio is the median over rounds of (tok/s / a limit measured just before it)")
    print(f"peak RSS {peak_rss:.0f} MiB; weights read per token: "
          f"{config.model_config.num_params / 1e6:.1f} M parameters")
    for row in results:
        if row["dtype"] == "float32" and row["batch"] == 1:
            ratios["b1_vs_bandwidth_limit"] = round(row["vs_bandwidth_limit"], 3)
        if row["dtype"] == "float32" and row["batch"] == 32:
            ratios["b32_vs_matmul_limit"] = round(row["vs_matmul_limit"], 3)
    ratios["peak_rss_mib"] = round(peak_rss)
    print("ratios:", ratios)
    write_json(args.json, "throughput", results, ratios)
    return 0
