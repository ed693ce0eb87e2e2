"""This machine's two limits, which `minivllm bench throughput` divides decode by: memory
bandwidth (a sum over a buffer far larger than the caches) and matmul FLOP/s, each the fastest
call within a time budget, since noise only lowers a limit.

The highest bandwidth this machine has read is kept between runs (best_bandwidth). A reading
can only fall short of what the memory system does, and on a VM it falls short for minutes at
a time: the host's memory bus is shared, and another tenant's traffic lowers the probe. On a
2-core Zen 4 VM, five back-to-back runs of `minivllm bench throughput --batches 1` read 35, 55,
58, 59 and 35 GB/s, each steady over its own rounds, while batch-1 decode read 142-150 tok/s
in all five: decode streams about 18 GB/s and did not feel what the probe, which asks for all
of it, did. Against each run's own probe `b1_vs_bandwidth_limit` read 0.24-0.41; against the
best reading it moves only as decode does. The record is keyed by the CPU, the thread count
and the memory size, in minivllm's cache directory next to the compiled kernels
(MINIVLLM_CACHE_DIR, else ~/.cache/minivllm).
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from minivllm.bench.common import huge_page_share
from minivllm.model import csrc_build
from minivllm.model.linear import onednn_linear, onednn_pack

BANDWIDTH_BYTES = 256 * 2**20  # far larger than the L3 cache, like the weights
MATMUL_SIZES = (256, 512, 1024, 2048)  # 2048: near the BLAS's peak; smaller where a call is slow
LIMIT_BUDGET_S = 1.0  # seconds per limit reading (--quick: a quarter)
MIN_CALLS = 2  # timed calls a limit makes even past its budget


@dataclass
class Limit:
    value: float  # bytes/s or FLOP/s: the fastest call, since noise only lowers a limit
    calls: int  # timed calls made within the budget
    size: int  # the bytes read, or the matmul's n
    huge_pages: float | None = None  # the bandwidth buffer's share in 2 MiB pages


def time_boxed(fn: Callable[[], object], budget_s: float,
               clock: Callable[[], float] = time.perf_counter) -> list[float]:
    """Call fn until budget_s has passed on `clock` (and at least MIN_CALLS times); the time of
    each call. A call is never cut short: a budget smaller than one call gives MIN_CALLS."""
    times: list[float] = []
    end = clock() + budget_s
    while True:
        start = clock()
        fn()
        stop = clock()
        times.append(stop - start)
        if stop >= end and len(times) >= MIN_CALLS:
            return times


def measure_bandwidth(budget_s: float, clock: Callable[[], float] = time.perf_counter) -> Limit:
    """Read bandwidth in bytes/s: a sum over a buffer much larger than the caches."""
    buf = torch.ones(BANDWIDTH_BYTES // 4)
    times = time_boxed(buf.sum, budget_s, clock)
    return Limit(BANDWIDTH_BYTES / min(times), len(times), BANDWIDTH_BYTES,
                 huge_page_share(buf.data_ptr()))


def measure_matmul(dtype: torch.dtype, budget_s: float,
                   clock: Callable[[], float] = time.perf_counter) -> Limit:
    """FLOP/s of a square matmul, the best of MKL (`a @ b`) and oneDNN with a prepacked weight
    (the kernel the model uses for many rows), within budget_s. The size doubles from 256 while
    one call takes under an eighth of the budget: where a dtype runs slowly the limit is read
    on a smaller product (reported as `size`) instead of grinding on a 2048^2 one."""
    end = clock() + budget_s
    for n in MATMUL_SIZES:
        a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
        start = clock()
        a @ b  # also the warm-up at the size kept
        if (clock() - start) * 8 > budget_s:
            break
    kernels = [lambda: a @ b]
    packed = onednn_pack(b.t())  # a @ b == a @ (b^T)^T: b^T is the (out, in) weight
    if packed is not None:
        kernels.append(lambda: onednn_linear(a, packed))
    share = max(end - clock(), 0.0) / len(kernels)
    runs = [time_boxed(k, share, clock) for k in kernels]
    return Limit(max(2 * n ** 3 / min(t) for t in runs), sum(map(len, runs)), n)


def record_path() -> Path:
    return csrc_build.cache_dir().parent / "bandwidth.json"


def machine_key() -> str:
    """What the limit belongs to: the CPU model, torch's threads (the probe's), the memory."""
    model = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f
                          if line.startswith("model name")), model)
    except OSError:
        pass
    memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return f"{model} | {torch.get_num_threads()} threads | {memory >> 30} GiB"


def best_bandwidth(reading: float) -> float:
    """The highest bandwidth (bytes/s) read on this machine, this reading included; saved."""
    p = record_path()
    try:
        record = json.loads(p.read_text())
    except (OSError, ValueError):
        record = {}
    key = machine_key()
    saved = float(record.get(key, 0.0))
    if reading <= saved:
        return saved
    record[key] = reading
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(f".{os.getpid()}.tmp")  # a second run writing at once: last wins
    tmp.write_text(json.dumps(record, indent=1))
    os.replace(tmp, p)
    return reading
