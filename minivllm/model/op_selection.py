"""Which model ops run in C on this CPU: each op timed against its torch version, the faster kept.

A kernel tuned on one CPU can lose to torch on another (on an AVX2-only EPYC the AVX-512-shaped
skinny_linear ran 1.5-2.8x slower than torch's matmul), so custom_ops.py measures before it
trusts one. Each op is timed at a few rows (batch 1-7 decode) and at many (32) on SmolLM2's
shapes, C and torch calls interleaved so that a neighbour's burst hits both, and the faster
kept: a few ms per op when the machine is quiet. The choice is cached next to the built
library, one file per thread count, so later processes read it instead of timing again (unless
it was timed on an oversubscribed machine that has since become quieter).

MINIVLLM_CUSTOM_OPS picks the policy: "auto" (the default: measured), "c" (every op in C where
it builds) or "torch" (no C at all). `python -m minivllm.model.csrc_build` builds, measures again
and prints the table; `minivllm bench throughput` prints it too.

    cache file cpu_ops-<build key>.t<threads>.json:
    {"threads": 2, "load_average": 1.2,
     "ops": {"skinny_linear/few": {"choice": "c", "c_speedup": 1.12, "c_us": 610.0,
                                   "torch_us": 700.0},
             "paged_decode/many": {...}, ...}}
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from pathlib import Path
from typing import Callable

import torch

from minivllm.model import csrc_build

MANY_ROWS = 8  # rows from which an op counts as "many" (decode batches of 8+, prefill)
ROW_OPS = ("add_rms_norm", "silu_and_mul", "rope_and_cache", "paged_decode", "argmax_rows")
OPS = ["skinny_linear/few"] + [f"{op}/{rows}" for op in ROW_OPS for rows in ("few", "many")]
ROUNDS = (5, 11)  # interleaved C/torch samples per op, at least and at most
BUDGET_S = 0.05  # per op: rounds stop past this (and ROUNDS[0]); quiet, all ops take < 1 s
SAMPLE_S = 1e-3  # a sample repeats the op until the slower version's lasts about this long
# SmolLM2-135M's shapes (the default model); the choice is made once for the CPU, not per model
HIDDEN, INTER, VOCAB = 576, 1536, 49152
HEADS, KV_HEADS, HEAD_DIM, BLOCK, CONTEXT = 9, 3, 64, 16, 256  # CONTEXT: tokens per sequence
LAYER_MATRICES = [((HEADS + 2 * KV_HEADS) * HEAD_DIM, HIDDEN), (HIDDEN, HEADS * HEAD_DIM),
                  (2 * INTER, HIDDEN), (HIDDEN, INTER)]  # qkv, o, gate_up, down: (out, in)
STREAM_LAYERS = 8  # 8 layers of weights (55 MB) do not fit in a 32 MiB L3, as the model's 0.5 GB


def rows_class(rows: int) -> str:
    return "many" if rows >= MANY_ROWS else "few"


def resolve() -> dict[str, str]:
    """{op key: "c" or "torch"} under MINIVLLM_CUSTOM_OPS (see the module docstring)."""
    mode = os.environ.get(csrc_build.ENABLE_ENV, "auto")
    if mode not in ("auto", "c", "torch"):
        raise ValueError(f"{csrc_build.ENABLE_ENV}={mode!r}: use auto, c or torch")
    if mode == "torch" or csrc_build.load() is None:
        return dict.fromkeys(OPS, "torch")
    if mode == "c":
        return dict.fromkeys(OPS, "c")
    return {key: row["choice"] for key, row in load_or_measure().items()}


def choice_file() -> Path:
    return csrc_build.build().with_suffix(f".t{torch.get_num_threads()}.json")


def load_or_measure(remeasure: bool = False) -> dict[str, dict]:
    """The cached timings of this build and thread count, else measured now and cached."""
    path = choice_file()
    if not remeasure and path.exists():
        try:
            record = json.loads(path.read_text())
            fresh = not _quieter_now(record["load_average"])
            if fresh and set(record["ops"]) == set(OPS) and "c_speedup" in record["ops"][OPS[0]]:
                return record["ops"]
        except (ValueError, KeyError, TypeError):
            pass  # a damaged or older file: measure again
    ops = measure()
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    record = {"threads": torch.get_num_threads(), "load_average": os.getloadavg()[0], "ops": ops}
    tmp.write_text(json.dumps(record, indent=1))
    os.replace(tmp, path)  # atomic: processes measuring at once each leave a whole file
    return ops


def _quieter_now(measured_at: float) -> bool:
    """A choice timed while the machine was oversubscribed (more runnable threads than cores:
    a parallel region then waits for a thread that is not running) is timed again once the
    load has halved."""
    cores = os.cpu_count() or 1
    return measured_at > cores and os.getloadavg()[0] < measured_at / 2


def paired_ratio(a: Callable[[], object], b: Callable[[], object],
                 budget_s: float = BUDGET_S) -> tuple[float, float, float]:
    """a and b timed in alternation, after a warm-up: the median of the rounds' a/b ratios, and
    the median seconds per call of each. A round takes one sample of each side by side, so a
    neighbour's load cancels in their ratio, and the median ignores a round that a burst hit on
    one side only. A sample repeats the call until the slower side's lasts about SAMPLE_S."""
    a(), b()  # warm-up: first-call allocations, thread pool start
    reps = max(1, math.ceil(SAMPLE_S / max(_once(a), _once(b), 1e-7)))
    samples: tuple[list[float], list[float]] = ([], [])
    end = time.perf_counter() + budget_s
    for r in range(ROUNDS[1]):
        if r >= ROUNDS[0] and time.perf_counter() > end:
            break
        for fn, out in zip((a, b), samples):
            start = time.perf_counter()
            for _ in range(reps):
                fn()
            out.append((time.perf_counter() - start) / reps)
    ratio = statistics.median(x / y for x, y in zip(*samples))
    return ratio, statistics.median(samples[0]), statistics.median(samples[1])


def faster(c: Callable[[], object], torch_fn: Callable[[], object],
           budget_s: float = BUDGET_S) -> dict:
    """The C and torch versions of an op compared (paired_ratio): {"choice", "c_speedup",
    "c_us", "torch_us"}, C kept where the median ratio says it is not slower."""
    ratio, c_s, torch_s = paired_ratio(c, torch_fn, budget_s)
    return {"choice": "c" if ratio <= 1 else "torch", "c_speedup": round(1 / ratio, 3),
            "c_us": round(c_s * 1e6, 2), "torch_us": round(torch_s * 1e6, 2)}


def _once(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


@torch.inference_mode()
def measure() -> dict[str, dict]:
    """Time every op of OPS in C and in torch on this CPU (well under a second when quiet)."""
    from minivllm.model import custom_ops
    saved = custom_ops.set_choices("c")
    try:
        result = {}
        for key in OPS:
            op, rows = key.split("/")
            run = _cases[op](1 if rows == "few" else 32)
            result[key] = faster(_as(custom_ops, key, "c", run), _as(custom_ops, key, "torch", run))
        return result
    finally:
        custom_ops.set_choices(saved)


def _as(custom_ops, key: str, way: str, run: Callable[[], object]) -> Callable[[], object]:
    def call() -> object:
        custom_ops.choices()[key] = way
        return run()
    return call


def _skinny_linear(rows: int) -> Callable[[], object]:
    from minivllm.model import custom_ops
    from minivllm.model.linear import matmul, split_rows
    weights = [torch.full(shape, 0.01) for shape in LAYER_MATRICES * STREAM_LAYERS]
    splits = [split_rows(w, torch.get_num_threads()) for w in weights]
    xs = {n: torch.randn(rows, n) for n in (HIDDEN, INTER)}

    def run() -> None:  # the C op, or (it returns None under "torch") the matmul Linear falls to
        for w, split in zip(weights, splits):
            x = xs[w.shape[1]]
            if custom_ops.skinny_linear(x, w) is None:
                matmul(x, split)
    return run


def _add_rms_norm(rows: int) -> Callable[[], object]:
    from minivllm.model import custom_ops
    x, delta = torch.randn(rows, HIDDEN), torch.zeros(rows, HIDDEN)
    return lambda: custom_ops.rms_norm(x, None, 1e-5, delta=delta)


def _silu_and_mul(rows: int) -> Callable[[], object]:
    from minivllm.model import custom_ops
    gate_up = torch.randn(rows, 2 * INTER)
    return lambda: custom_ops.silu_and_mul(gate_up)


def _paged_cache(rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A cache of rows sequences of CONTEXT tokens each, and their block tables."""
    blocks = CONTEXT // BLOCK
    cache = torch.randn(2, KV_HEADS, rows * blocks, BLOCK * HEAD_DIM)
    return cache, torch.randperm(rows * blocks).view(rows, blocks)


def _rope_and_cache(rows: int) -> Callable[[], object]:
    from minivllm.model import custom_ops
    cache, tables = _paged_cache(rows)
    qkv = torch.randn(rows, (HEADS + 2 * KV_HEADS) * HEAD_DIM)
    angles = torch.rand(CONTEXT + 1, HEAD_DIM // 2).repeat(1, 2)  # a true rotation: the
    sign = torch.cat([-torch.ones(HEAD_DIM // 2), torch.ones(HEAD_DIM // 2)])  # repeats stay finite
    cos, sin = angles.cos(), angles.sin() * sign
    positions = torch.full((rows,), CONTEXT)
    slots = tables[:, -1] * BLOCK + BLOCK - 1
    return lambda: custom_ops.rope_and_cache(qkv, positions, cos, sin, HEADS, KV_HEADS, HEAD_DIM,
                                             cache, slots)


def _paged_decode(rows: int) -> Callable[[], object]:
    from minivllm.model.attention import AttentionMetadata, paged_attention
    cache, tables = _paged_cache(rows)
    q = torch.randn(rows, HEADS, HEAD_DIM)
    meta = AttentionMetadata(slot_mapping=torch.zeros(rows, dtype=torch.int64), num_decodes=rows,
                             decode_block_tables=tables,
                             decode_seq_lens=torch.full((rows,), CONTEXT))
    return lambda: paged_attention(q, cache, meta)  # the C op, or the torch gather it falls to


def _argmax_rows(rows: int) -> Callable[[], object]:
    from minivllm.model import custom_ops
    logits = torch.randn(rows, VOCAB)
    return lambda: custom_ops.argmax(logits)


_cases = {"skinny_linear": _skinny_linear, "add_rms_norm": _add_rms_norm,
          "silu_and_mul": _silu_and_mul, "rope_and_cache": _rope_and_cache,
          "paged_decode": _paged_decode, "argmax_rows": _argmax_rows}


def table(ops: dict[str, dict]) -> list[dict]:
    """Rows for print_table: op, rows, which way it runs, both timings and the C speedup (the
    median of the rounds' ratios, which decided)."""
    return [{"op": key.split("/")[0], "rows": "1-7" if key.endswith("few") else "8+",
             "runs": row["choice"], "c_us": row["c_us"], "torch_us": row["torch_us"],
             "c_speedup": row["c_speedup"]} for key, row in ops.items()]
