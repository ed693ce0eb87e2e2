"""The executor's share of `minivllm bench overhead`: what the MessageQueue between the engine
core and its workers costs a decode step, and where a tensor-parallel step's time goes.

- mp_executor_vs_uniproc_b{B}: decode tok/s with the worker in its own process behind the
  broadcast MessageQueue (distributed_executor_backend="mp", TP=1) over tok/s with the worker
  inside the engine core (UniProcExecutor); both engine cores in this process, stepped side by
  side in rounds.
- tp3 step breakdown: TP=3 decode steps, each split by MultiprocExecutor.last_step into
  broadcast (enqueue -> the output rank has the step), forward (collectives excluded),
  collective (all-reduce and gather) and reply (enqueue -> the executor has it).
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from minivllm.engine.config import EngineConfig
from minivllm.engine.core import EngineCore
from minivllm.engine.messages import EngineCoreRequest
from minivllm.sampling_params import SamplingParams

PROMPT_LEN = 16
WARMUP_STEPS = 3
BREAKDOWN = ("broadcast", "forward", "collective", "reply")


def decode_steps(core: EngineCore, batch: int, steps: int, tag: str, on_step=None) -> float:
    """Seconds per decode step of `batch` sequences, over `steps` steps after a warm-up."""
    vocab = core.config.model_config.vocab_size
    params = SamplingParams(temperature=0.0, max_tokens=WARMUP_STEPS + steps + 4, ignore_eos=True)
    ids = [f"{tag}-{i}" for i in range(batch)]
    for i, rid in enumerate(ids):
        prompt = (np.arange(PROMPT_LEN, dtype=np.int32) * 7 + 13 * i) % (vocab - 3) + 3
        core.add_request(EngineCoreRequest(rid, prompt, params))
    for _ in range(1 + WARMUP_STEPS):  # the prefill, then warm decode steps
        core.step()
    start = time.perf_counter()
    for _ in range(steps):
        core.step()
        if on_step is not None:
            on_step()
    elapsed = time.perf_counter() - start
    core.abort_requests(ids)
    return elapsed / steps


def mp_vs_uniproc(config: EngineConfig, batch: int, steps: int, rounds: int) -> dict:
    """Side by side: the same decode batch on the uni and the mp (TP=1) executor."""
    uni = EngineCore(config.replace(distributed_executor_backend="uni", tensor_parallel_size=1))
    mp = EngineCore(config.replace(distributed_executor_backend="mp", tensor_parallel_size=1))
    samples = []
    try:
        for r in range(rounds):
            order = [(uni, "uni"), (mp, "mp")][::1 if r % 2 else -1]  # alternate who goes first
            t = {tag: decode_steps(core, batch, steps, f"{tag}{r}") for core, tag in order}
            samples.append((t["uni"], t["mp"]))
    finally:
        uni.shutdown()
        mp.shutdown()
    return {"kind": "executor", "batch": batch,
            "uniproc_step_ms": statistics.median(s[0] for s in samples) * 1e3,
            "mp_step_ms": statistics.median(s[1] for s in samples) * 1e3,
            "mp_executor_vs_uniproc": statistics.median(s[0] / s[1] for s in samples),
            "rounds": rounds}


def tp_breakdown(config: EngineConfig, batch: int, steps: int, tp: int = 3) -> dict:
    """Median ms of each part of a TP=tp decode step, and the step's total."""
    core = EngineCore(config.replace(distributed_executor_backend="mp", tensor_parallel_size=tp))
    parts: list = []
    try:
        step_s = decode_steps(core, batch, steps, f"tp{tp}",
                              on_step=lambda: parts.append(core.model_executor.last_step))
    finally:
        core.shutdown()
    row = {"kind": f"tp{tp}_step", "batch": batch, "step_ms": step_s * 1e3,
           "execute_model_ms": statistics.median(p.total for p in parts) * 1e3}
    for name in BREAKDOWN:
        row[f"{name}_ms"] = statistics.median(getattr(p, name) for p in parts) * 1e3
    return row


def executor_rows(config: EngineConfig, batch: int, steps: int, rounds: int,
                  ratios: dict) -> list[dict]:
    """Both measurements, printed as tables; the headline ratio goes into `ratios`."""
    from minivllm.bench.common import print_table
    from minivllm.bench.load import LoadMeter
    with LoadMeter() as load:
        mp = mp_vs_uniproc(config, batch, steps, rounds)
        tp = tp_breakdown(config, batch, steps)
    print_table([mp], ["batch", "uniproc_step_ms", "mp_step_ms", "mp_executor_vs_uniproc",
                       "rounds"])
    print_table([tp], ["batch", "step_ms", "execute_model_ms",
                       *(f"{n}_ms" for n in BREAKDOWN)])
    print(load.describe(what="the executor rows"))
    ratios[f"mp_executor_vs_uniproc_b{batch}"] = round(mp["mp_executor_vs_uniproc"], 3)
    ratios[f"tp3_step_ms_b{batch}"] = round(tp["step_ms"], 2)
    return [mp, tp]
