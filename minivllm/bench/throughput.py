"""`minivllm bench throughput`: offline decode tok/s of the in-process engine, next to this
machine's two limits (bench/limits.py), measured in the same run. Batch 1 is divided by the
best bandwidth this machine has read, kept between runs: other programs lower the probe far
more than they lower decode (bench/limits.py says what moved it).

- Batch 1 reads every weight once per token: its limit is memory bandwidth / the bytes a step
  reads, the weights as they are stored (a GGUF's blocks where the layers run on them:
  model/quant_linear.py) and the KV cache its attention reads.
- Batch 32 does 2 FLOPs per weight per token: its limit is matmul FLOP/s / (2 x weights).

Each row: the engine (EngineCore.step: scheduler, runner, sampler) and the model alone
(forward + logits on the same shapes), the in-process baseline later chapters compare against.

Every reading has a time box, so the default run ends in a few minutes on any CPU. A limit
runs until its budget is spent, and the matmul is sized to the machine (it grows from 256 while
a call stays short): without avx512_bf16 a bfloat16 2048^2 product took 14 s on an AVX2 EPYC.
A dtype the CPU only emulates gets a brief row (batch 1, one round, a short context) and the
reason. Before a row starts, one timed model step estimates it, and a long row says so.

Last, the C ops: which run in C and which in torch on this CPU (model/op_selection.py), and
batch-1 decode with that choice, all C and all torch, interleaved round by round.
"""

from __future__ import annotations

import os
import resource
import statistics
import time
from dataclasses import dataclass

import numpy as np
import torch

from minivllm.bench import limits
from minivllm.bench.limits import LIMIT_BUDGET_S, Limit, measure_bandwidth, measure_matmul
from minivllm.bench.common import (bench_parser, huge_page_share, median_time, page_faults,
                                   print_table, quick_mode, spread, transparent_hugepages,
                                   write_json)
from minivllm.engine.config import KV_CACHE_DTYPES, EngineConfig
from minivllm.engine.core import EngineCore
from minivllm.engine.messages import EngineCoreRequest
from minivllm.model import cpu_features, csrc_build, op_choice, op_selection
from minivllm.model.attention import AttentionMetadata
from minivllm.sampling_params import SamplingParams
from minivllm.utils.progress import tqdm

PROMPT_LEN = 64  # tokens of context each sequence has when decode timing starts
EMULATED_PROMPT_LEN = 16  # an emulated dtype prefills slowly: a short context keeps it brief
WARMUP_STEPS = 2  # the first steps fault in KV cache pages and start the thread pool
LONG_ROW_S = 20.0  # a row estimated past this says so before it starts
ROUNDS = 5  # limit and decode, alternately, per row (--quick: 1): the ratio is their median
STEADY_SPREAD = 0.10  # rounds within +-10% of their median: a steady ratio
LOW_PROBE = 0.8  # a run's bandwidth under this share of the machine's best is named
OPS_ROUNDS = 9  # rounds of the C ops comparison, 6 steps per mode each (--quick: 2 of 2):
# many short rounds, because each round's ratio is what survives a busy neighbour


@dataclass
class RowPlan:
    """How one dtype is measured: every batch asked for, or briefly where it is emulated."""
    batches: list[int]
    steps: int
    rounds: int
    prompt_len: int = PROMPT_LEN
    emulated: str | None = None  # why the CPU does not run this dtype natively


def plan(dtype: str, batches: list[int], steps: int, rounds: int) -> RowPlan:
    reason = cpu_features.bf16_missing() if dtype == "bfloat16" else None
    if reason is None:
        return RowPlan(batches, steps, rounds)
    return RowPlan([min(batches)], min(steps, 4), 1, EMULATED_PROMPT_LEN, reason)


def engine_decode(core: EngineCore, batch: int, steps: int, tag: str,
                  prompt_len: int = PROMPT_LEN) -> float:
    """Decode tok/s through EngineCore.step() once every sequence is past its prompt, from the
    median step time, as the model row is timed: on a shared machine a few steps take a
    neighbour's hit, and a mean would charge those to the engine."""
    rng = np.random.default_rng(batch)
    vocab = core.config.model_config.vocab_size
    params = SamplingParams(temperature=0.0, max_tokens=steps + WARMUP_STEPS + 1, ignore_eos=True)
    for i in range(batch):
        prompt = rng.integers(100, vocab, prompt_len, dtype=np.int32)
        core.add_request(EngineCoreRequest(f"{tag}-{i}", prompt, params))
    while any(r.num_output_tokens < WARMUP_STEPS for r in core.scheduler.requests.values()):
        core.step()  # prefill, then a few untimed decode steps
    step_time = median_time(core.step, steps)
    while core.has_unfinished_requests():
        core.step()
    return batch / step_time


def model_decode(core: EngineCore, batch: int, steps: int, prompt_len: int = PROMPT_LEN) -> float:
    """The model alone: forward + logits for `batch` decode tokens over prompt_len of context."""
    runner = core.model_executor.driver_worker.model_runner
    model, bs = runner.model, core.config.block_size
    blocks = -(-(prompt_len + 1) // bs)
    tables = torch.arange(batch * blocks).view(batch, blocks)
    slots = tables[:, prompt_len // bs] * bs + prompt_len % bs
    meta = AttentionMetadata(slot_mapping=slots, num_decodes=batch, decode_block_tables=tables,
                             decode_seq_lens=torch.full((batch,), prompt_len + 1))
    ids, pos = torch.full((batch,), 1000), torch.full((batch,), prompt_len)

    def step() -> None:
        with torch.inference_mode():
            model.compute_logits(model.forward(ids, pos, runner.kv_caches, meta)).argmax(-1)
    step()  # warm-up
    return batch / median_time(step, steps)


def estimate_row(core: EngineCore, batch: int, rp: RowPlan, budget_s: float,
                 matmul_flops: float) -> float:
    """Seconds a row will take: its decode steps at the speed of one timed model step, its
    prefill at the matmul limit, and the limits' budgets, for every round and once more."""
    step_s = batch / model_decode(core, batch, 1, rp.prompt_len)
    prefill_s = batch * rp.prompt_len * 2 * core.config.model_config.num_params / matmul_flops
    per_round = 2 * budget_s + prefill_s + (2 * rp.steps + WARMUP_STEPS + 2) * step_s
    return rp.rounds * per_round + 2 * budget_s


def measure_row(core: EngineCore, dtype: str, batch: int, rp: RowPlan, budget_s: float) -> dict:
    """Engine and model tok/s for one batch, each round between two fresh readings of both
    limits.

    The machine's speed drifts (neighbours, memory phases), so each ratio is taken within a
    round, between measurements seconds apart, and the row reports the median over rounds. A
    limit is the higher of the readings on either side of the round's decode: a probe that
    fell into another program's burst reads low (on a 2-core VM, one reading in a dozen came
    in at 32 GB/s among 54-58 ones, whichever buffer it read), and a limit is what the
    machine can do, as each reading is already the fastest of its calls.
    """
    cfg = core.config
    model = core.model_executor.driver_worker.model_runner.model
    weight_bytes = model.weight_bytes_per_step()
    kv_bytes = batch * (rp.prompt_len + 1) * cfg.kv_bytes_per_token
    step_bytes_per_tok = (weight_bytes + kv_bytes) / batch
    flops_per_token = 2 * cfg.model_config.num_params

    def read_limits() -> tuple[Limit, Limit, int]:
        faults = page_faults()
        probe, matmul = measure_bandwidth(budget_s), measure_matmul(cfg.torch_dtype, budget_s)
        return probe, matmul, page_faults() - faults

    samples, before = [], read_limits()
    for r in range(rp.rounds):
        faults = page_faults()
        engine = engine_decode(core, batch, rp.steps, f"{dtype}-{batch}-{r}", rp.prompt_len)
        tokens = batch * (rp.steps + WARMUP_STEPS + 1)
        decode_faults = page_faults() - faults
        model_tok_s = model_decode(core, batch, rp.steps, rp.prompt_len)
        after = read_limits()
        bandwidth = max(before[0].value, after[0].value)
        matmul = max(before[1], after[1], key=lambda m: m.value)
        samples.append({"faults_per_token": decode_faults / tokens, "limit_faults": before[2],
                        "probe_huge": before[0].huge_pages or 0.0,
                        "process_huge": huge_page_share() or 0.0, "engine_tok_s": engine,
                        "model_tok_s": model_tok_s, "bandwidth_GB_s": bandwidth / 1e9,
                        "matmul_GFLOP_s": matmul.value / 1e9, "matmul_n": matmul.size,
                        "vs_run_bandwidth": engine * step_bytes_per_tok / bandwidth,
                        "vs_matmul_limit": engine * flops_per_token / matmul.value})
        before = after
    best = limits.best_bandwidth(max(s["bandwidth_GB_s"] for s in samples) * 1e9)
    for s in samples:  # against what this machine's memory does: bench/limits.py
        s["vs_bandwidth_limit"] = s["engine_tok_s"] * step_bytes_per_tok / best
        s["best_bandwidth_GB_s"] = best / 1e9
    row = {"dtype": dtype, "batch": batch, "rounds": rp.rounds, "context": rp.prompt_len,
           "emulated": rp.emulated is not None, "weight_MB": weight_bytes / 1e6,
           "kv_MB": kv_bytes / 1e6}
    row.update({k: statistics.median(s[k] for s in samples) for k in samples[0]})
    for key, name in (("vs_bandwidth_limit", "ratio_spread"), ("bandwidth_GB_s", "bw_spread"),
                      ("engine_tok_s", "tok_s_spread")):
        row[name] = spread([s[key] for s in samples])
    return row


def compare_ops(core: EngineCore, steps: int, rounds: int) -> dict[str, float]:
    """Batch-1 decode (the model alone) with the ops chosen for this CPU, all in C and all in
    torch, interleaved in every round; each ratio is the median of the rounds' ratios."""
    chosen = op_choice.table()
    modes = {"chosen": dict(chosen), "c": "c", "torch": "torch"}
    tok_s: dict[str, list[float]] = {mode: [] for mode in modes}
    try:
        for _ in range(rounds):
            for mode, choice in modes.items():
                op_choice.set_table(choice)
                tok_s[mode].append(model_decode(core, 1, steps))
    finally:
        op_choice.set_table(chosen)
    out = {f"b1_tok_s_{mode}_ops": statistics.median(v) for mode, v in tok_s.items()}
    for mode in ("chosen", "c"):
        out[f"b1_{mode}_ops_vs_torch_ops"] = statistics.median(
            a / b for a, b in zip(tok_s[mode], tok_s["torch"]))
    return out


def describe_cpu() -> dict:
    """The flags the figures depend on, what the kernels use, and which ops run in C."""
    built = csrc_build.load() is not None
    return {"cpu_flags": cpu_features.cpu_flags(), "isa": cpu_features.isa(),
            "c_ops": op_choice.table() if built else "not built"}


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser("throughput", __doc__)
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--rounds", type=int, default=None,
                        help=f"limit and decode readings, alternately, per row (default "
                             f"{ROUNDS}; --quick: 1)")
    parser.add_argument("-q", "--quantization", default=None, choices=["gguf", "none"],
                        help="as `minivllm serve`: none dequantizes a GGUF's blocks at load")
    parser.add_argument("--kv-cache-dtype", default="auto", choices=KV_CACHE_DTYPES,
                        help="as `minivllm serve`: the KV cache's element type")
    args = parser.parse_args(argv)
    quick = args.quick or quick_mode()
    steps, rounds = (4, 1) if quick else (24, ROUNDS)
    rounds = args.rounds or rounds
    budget_s = LIMIT_BUDGET_S / 4 if quick else LIMIT_BUDGET_S
    batches = [int(b) for b in args.batches.split(",")]
    cpu = describe_cpu()
    flags = ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in cpu["cpu_flags"].items())
    print(f"CPU flags: {flags}; torch kernels {cpu['isa']['torch']}, C ops "
          f"-march={cpu['isa']['c_ops_march']}; load average {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} cores")
    plans = {dtype: plan(dtype, batches, steps, rounds) for dtype in args.dtypes.split(",")}
    results, ratios, ops = [], {}, {}
    bar = tqdm(total=sum(len(rp.batches) for rp in plans.values()), desc="throughput", unit="row")
    for dtype, rp in plans.items():
        if rp.emulated:
            tqdm.write(f"{dtype} is emulated here ({rp.emulated}): batch {rp.batches[0]} only, "
                       f"one round, {rp.prompt_len} tokens of context")
        config = EngineConfig(dtype=dtype, quantization=args.quantization,
                              kv_cache_dtype=args.kv_cache_dtype,
                              max_num_batched_tokens=max(rp.batches) * rp.prompt_len)
        core = EngineCore(config)
        flops = measure_matmul(config.torch_dtype, budget_s / 2).value
        for batch in rp.batches:
            estimate = estimate_row(core, batch, rp, budget_s, flops)
            bar.set_postfix_str(f"{dtype} batch {batch}: about {estimate:.0f} s")
            if estimate > LONG_ROW_S:
                tqdm.write(f"{dtype} batch {batch} will take about {estimate:.0f} s")
            start = time.perf_counter()
            results.append(measure_row(core, dtype, batch, rp, budget_s))
            results[-1]["seconds"] = time.perf_counter() - start
            bar.update(1)
        if dtype == "float32" and cpu["c_ops"] != "not built":
            bar.set_postfix_str("C ops against torch, batch 1")
            ops = compare_ops(core, 2 if quick else 6, 2 if quick else OPS_ROUNDS)
        core.shutdown()
        del core
    bar.close()
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10
    print_table(results, ["dtype", "batch", "engine_tok_s", "model_tok_s", "bandwidth_GB_s",
                          "best_bandwidth_GB_s", "matmul_GFLOP_s", "matmul_n",
                          "vs_bandwidth_limit", "vs_run_bandwidth", "vs_matmul_limit",
                          "rounds", "ratio_spread", "bw_spread", "tok_s_spread",
                          "faults_per_token", "probe_huge", "process_huge", "seconds"])
    print("each ratio is the median over rounds of tok/s over a limit: a round's limit is the "
          "higher reading on either side of its decode; vs_bandwidth_limit divides by the best "
          f"bandwidth this machine has read ({limits.record_path()}), vs_run_bandwidth by "
          "this run's; *_spread: half the range over the median, of the ratio, the bandwidth "
          "and tok/s")
    print(steadiness_note(results))
    print(*low_probe_notes(results), sep="\n")
    print(f"peak RSS {peak_rss:.0f} MiB; bytes read per batch-{batches[0]} step "
          f"(vs_bandwidth_limit's): " + ", ".join(
              f"{r['dtype']} {r['weight_MB']:.0f} MB of weights + {r['kv_MB']:.1f} MB of KV cache"
              for r in results if r["batch"] == batches[0]))
    if ops:
        print_ops(ops)
    for row in results:
        if row["dtype"] == "float32" and row["batch"] == 1:
            ratios["b1_vs_bandwidth_limit"] = round(row["vs_bandwidth_limit"], 3)
            if row["rounds"] > 1:  # one round has no spread
                ratios["b1_vs_bandwidth_limit_spread"] = round(row["ratio_spread"], 3)
        if row["dtype"] == "float32" and row["batch"] == 32:
            ratios["b32_vs_matmul_limit"] = round(row["vs_matmul_limit"], 3)
    ratios.update({k: round(v, 3) for k, v in ops.items() if k.endswith("_vs_torch_ops")})
    ratios["peak_rss_mib"] = round(peak_rss)
    print("ratios:", ratios)
    write_json(args.json, "throughput", results, ratios, machine=cpu)
    return 0


def steadiness_note(rows: list[dict]) -> str:
    """Whether the batch-1 ratio held still over its rounds, and if not, which side moved."""
    b1 = [r for r in rows if r["batch"] == 1 and r["rounds"] > 1]
    pages = f"transparent huge pages: {transparent_hugepages() or 'unknown'}"
    worst = max(b1, key=lambda r: r["ratio_spread"], default=None)
    if worst is None or worst["ratio_spread"] <= STEADY_SPREAD:
        return f"batch 1: {'steady within +-10%' if worst else 'one round, no spread'}; {pages}"
    side = "the bandwidth probe" if worst["bw_spread"] > worst["tok_s_spread"] else "decode"
    return (f"batch 1 NOT steady: {worst['dtype']} vs_bandwidth_limit +-"
            f"{worst['ratio_spread']:.0%} over {worst['rounds']} rounds, {side} moved most; "
            f"{worst['faults_per_token']:.0f} page faults a token; {pages}, in 2 MiB pages: "
            f"{worst['probe_huge']:.0%} of the probe's buffer, {worst['process_huge']:.0%} of "
            f"this process (weights). Other programs' "
            f"load moves both sides (a small VM shares its memory bus): rerun when quiet.")


def low_probe_notes(rows: list[dict]) -> list[str]:
    """A line for each row whose bandwidth probe read well under this machine's best."""
    return [f"{r['dtype']} batch {r['batch']}: this run's bandwidth probe read "
            f"{r['bandwidth_GB_s']:.0f} GB/s, this machine's best {r['best_bandwidth_GB_s']:.0f}:"
            f" other programs' memory traffic (a VM shares the host's memory bus) lowers the "
            f"probe more than a decode that streams less; vs_bandwidth_limit divides by the best"
            for r in rows if r["bandwidth_GB_s"] < LOW_PROBE * r["best_bandwidth_GB_s"]]


def print_ops(ops: dict[str, float]) -> None:
    print("\nC ops on this CPU (timed against torch at load, cached with the build):")
    print_table(op_selection.table(op_selection.load_or_measure()),
                ["op", "rows", "runs", "c_us", "torch_us", "c_speedup"])
    print(f"batch-1 decode, model alone, interleaved: chosen ops {ops['b1_tok_s_chosen_ops']:.1f}"
          f" tok/s, all C {ops['b1_tok_s_c_ops']:.1f}, all torch {ops['b1_tok_s_torch_ops']:.1f};"
          f" chosen/torch {ops['b1_chosen_ops_vs_torch_ops']:.3f}, C/torch "
          f"{ops['b1_c_ops_vs_torch_ops']:.3f} (medians of per-round ratios)")
