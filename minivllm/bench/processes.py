"""`minivllm bench processes`: the GIL (threads vs processes on CPU-bound work) and the
start-up cost of fork, spawn and forkserver, on this machine. Chapter 01 runs these.

    minivllm bench processes [--quick] [--json FILE]

Everything a child runs is defined here, in a module, because spawn cannot send a function
defined in __main__.
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import threading
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

from minivllm.bench.common import bench_parser, print_table, quick_mode, write_json
from minivllm.utils.mp import launch

BURN_STEPS = {False: 6_000_000, True: 2_000_000}  # ~0.3-1 s of pure-Python work per worker
GIL_ROUNDS = {False: 3, True: 1}  # serial, threads, processes in turn; the median of rounds
STARTS = {False: 7, True: 3}  # launches per start method; the median is reported
METHODS = ("fork", "forkserver", "spawn")


def burn(steps: int) -> int:
    """CPU-bound pure Python: holds the GIL the whole time."""
    total = 0
    for i in range(steps):
        total += i * i % 7
    return total


def ready_at_once(link) -> None:
    link.ready(os.getpid())
    link.wait_stop()


def timed_burn(steps: int) -> float:
    """burn(steps); returns the CPU seconds this thread spent on it (not the time it waited)."""
    start = time.thread_time()
    burn(steps)
    return time.thread_time() - start


def _timed(pool, steps: int, workers: int) -> tuple[float, float]:
    """Wall seconds for `workers` burns on the pool, and the CPU seconds they used."""
    start = time.perf_counter()
    cpu = sum(pool.map(timed_burn, [steps] * workers))
    return time.perf_counter() - start, cpu


def gil_experiment(workers: int = 2, steps: int | None = None,
                   rounds: int | None = None) -> dict[str, float]:
    """Seconds for `workers` burns: one after another, on threads, on (warm) processes.

    The three run in turn, `rounds` times, and each figure is the median: a load spike from
    another program then hits one round of each, not all of one. `*_cores` is CPU seconds
    over wall seconds, the cores the burns used at once: threads cannot pass 1.0 (the GIL).
    """
    steps, rounds = steps or BURN_STEPS[quick_mode()], rounds or GIL_ROUNDS[quick_mode()]
    samples: dict[str, list[float]] = {k: [] for k in ("serial", "threads", "processes",
                                                        "threads_cores", "processes_cores")}
    ctx = multiprocessing.get_context("spawn" if threading.active_count() > 1 else "fork")
    with ThreadPoolExecutor(workers) as threads, ProcessPoolExecutor(workers, mp_context=ctx) as procs:
        list(procs.map(burn, [1] * workers))  # start the workers first: measure only the work
        for _ in range(rounds):
            start = time.perf_counter()
            for _ in range(workers):
                burn(steps)
            samples["serial"].append(time.perf_counter() - start)
            for name, pool in (("threads", threads), ("processes", procs)):
                wall, cpu = _timed(pool, steps, workers)
                samples[name].append(wall)
                samples[f"{name}_cores"].append(cpu / wall)
    med = {k: statistics.median(v) for k, v in samples.items()}
    return {"workers": workers, "rounds": rounds, "serial_s": med["serial"],
            "threads_s": med["threads"], "processes_s": med["processes"],
            "threads_cores": med["threads_cores"], "processes_cores": med["processes_cores"],
            "load_1min": os.getloadavg()[0]}


def startup_cost(method: str, starts: int | None = None) -> dict[str, float]:
    """Median seconds from launch() to the child's ready message, and to its exit."""
    ctx = multiprocessing.get_context(method)
    ready, total = [], []
    for _ in range(starts or STARTS[quick_mode()]):
        start = time.perf_counter()
        handle = launch(ready_at_once, f"start-{method}", context=ctx, ready_timeout=60)
        ready.append(time.perf_counter() - start)
        handle.shutdown()
        total.append(time.perf_counter() - start)
    if method == "forkserver":  # stop the server and remove its socket file: leave nothing
        from multiprocessing import forkserver
        forkserver._forkserver._stop()
    return {"method": method, "ready_ms": statistics.median(ready) * 1e3,
            "ready_and_exit_ms": statistics.median(total) * 1e3}


def main(argv: list[str] | None = None) -> int:
    args = bench_parser("processes", __doc__).parse_args(argv)
    if args.quick:
        os.environ["MINIVLLM_QUICK"] = "1"
    gil = gil_experiment()
    print_table([gil | {"threads_vs_serial": gil["threads_s"] / gil["serial_s"],
                        "processes_vs_serial": gil["processes_s"] / gil["serial_s"]}],
                ["workers", "serial_s", "threads_s", "processes_s", "threads_vs_serial",
                 "processes_vs_serial", "threads_cores", "processes_cores", "load_1min"])
    starts = [startup_cost(m) for m in METHODS if m in multiprocessing.get_all_start_methods()]
    print_table(starts, ["method", "ready_ms", "ready_and_exit_ms"])
    by = {s["method"]: s["ready_ms"] for s in starts}
    ratios = {"threads_vs_serial": gil["threads_s"] / gil["serial_s"],
              "processes_vs_serial": gil["processes_s"] / gil["serial_s"]}
    ratios |= {f"{m}_vs_fork_startup": by[m] / by["fork"] for m in by if m != "fork"}
    write_json(args.json, "processes", [gil] + starts, ratios)
    return 0
