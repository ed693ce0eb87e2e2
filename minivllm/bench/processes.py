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
STARTS = {False: 7, True: 3}  # launches per start method; the median is reported
METHODS = ("fork", "forkserver", "spawn")
LOCK_WAIT_S = 1.0  # a child that cannot take a free lock in this long never will


def burn(steps: int) -> int:
    """CPU-bound pure Python: holds the GIL the whole time."""
    total = 0
    for i in range(steps):
        total += i * i % 7
    return total


def ready_at_once(link) -> None:
    link.ready(os.getpid())
    link.wait_stop()


def slow_to_ready(link, delay_s: float) -> None:
    time.sleep(delay_s)  # a model load that takes too long
    link.ready()


def middle_with_children(link, n: int) -> None:
    """A parent in the middle: launches n children, reports their pids, then idles."""
    kids = [launch(ready_at_once, f"kid{i}", ready_timeout=60) for i in range(n)]
    link.ready([k.pid for k in kids])
    while True:
        time.sleep(0.1)


def gil_experiment(workers: int = 2, steps: int | None = None) -> dict[str, float]:
    """Seconds for `workers` burns: one after another, on threads, on (warm) processes."""
    steps = steps or BURN_STEPS[quick_mode()]
    start = time.perf_counter()
    for _ in range(workers):
        burn(steps)
    serial = time.perf_counter() - start
    with ThreadPoolExecutor(workers) as pool:
        start = time.perf_counter()
        list(pool.map(burn, [steps] * workers))
        threads = time.perf_counter() - start
    ctx = multiprocessing.get_context("spawn" if threading.active_count() > 1 else "fork")
    with ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        list(pool.map(burn, [1] * workers))  # start the workers first: measure only the work
        start = time.perf_counter()
        list(pool.map(burn, [steps] * workers))
        processes = time.perf_counter() - start
    return {"workers": workers, "serial_s": serial, "threads_s": threads, "processes_s": processes}


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


def _child_takes_lock(lock: threading.Lock) -> None:
    os._exit(0 if lock.acquire(timeout=LOCK_WAIT_S) else 1)


def fork_while_a_thread_holds_a_lock() -> str:
    """Fork while another thread holds a lock; the child's copy of the lock stays held forever."""
    lock, held = threading.Lock(), threading.Event()

    def holder():
        with lock:
            held.set()
            time.sleep(LOCK_WAIT_S * 2)
    t = threading.Thread(target=holder)
    t.start()
    held.wait()
    pid = os.fork()  # only this thread is copied; the lock is copied in its held state
    if pid == 0:
        _child_takes_lock(lock)
    _, status = os.waitpid(pid, 0)
    t.join()
    if os.waitstatus_to_exitcode(status) == 1:
        return (f"the forked child waited {LOCK_WAIT_S:g} s for the lock and gave up: the thread "
                "holding it was not copied, so nobody will ever release it")
    return "the child took the lock (the holder released it before the fork)"


def main(argv: list[str] | None = None) -> int:
    args = bench_parser("processes", __doc__.splitlines()[0]).parse_args(argv)
    if args.quick:
        os.environ["MINIVLLM_QUICK"] = "1"
    gil = gil_experiment()
    print_table([gil | {"threads_vs_serial": gil["threads_s"] / gil["serial_s"],
                        "processes_vs_serial": gil["processes_s"] / gil["serial_s"]}],
                ["workers", "serial_s", "threads_s", "processes_s", "threads_vs_serial",
                 "processes_vs_serial"])
    starts = [startup_cost(m) for m in METHODS if m in multiprocessing.get_all_start_methods()]
    print_table(starts, ["method", "ready_ms", "ready_and_exit_ms"])
    by = {s["method"]: s["ready_ms"] for s in starts}
    ratios = {"threads_vs_serial": gil["threads_s"] / gil["serial_s"],
              "processes_vs_serial": gil["processes_s"] / gil["serial_s"]}
    ratios |= {f"{m}_vs_fork_startup": by[m] / by["fork"] for m in by if m != "fork"}
    write_json(args.json, "processes", [gil] + starts, ratios)
    return 0
