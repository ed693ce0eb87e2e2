"""`minivllm bench ipc`: pipe, Unix socket, TCP loopback and shared memory between two
processes, against memcpy in one process, on this machine, in one run.

    minivllm bench ipc [--quick] [--json FILE] [--plot FILE]

Bandwidth: one child sends `count` messages of each size, the parent receives them; the
median of REPEATS runs, each timed from the sender's start to the last byte received (the
time the sender took to wake for the bench's command is the row's start_lag_ms). memcpy is the limit: the same bytes copied once, into a private ring
as large as the shm ring, in one process (exactly the shm sender's copy, without a receiver),
sampled between the transports; its median is over those samples.
Latency: round trips of a 64-byte message, p50 and p99. Context switches and CPU time are
both processes' (psutil), summed over the runs of a point. The ratios compare each
transport with memcpy at RATIO_SIZE, measured side by side: REPEATS rounds of memcpy,
the transport twice, memcpy again; each ratio is the median of its rounds' ratios, printed with
their spread (KEY_spread in the JSON: half the range over the median).
"""

from __future__ import annotations

import mmap
import os
import statistics
import time
from textwrap import fill
from typing import Any

import numpy as np
import psutil

from minivllm.bench.common import (bench_parser, percentile, print_table, quick_mode, spread,
                                   write_json)
from minivllm.bench._ipc_transports import COPIES_PER_BYTE, RING_BYTES, Transport, slots_for
from minivllm.utils.progress import tqdm

TRANSPORTS = ["pipe", "pipe_big", "unix", "tcp", "shm", "shm_copy"]
SIZES = [64 * 4**k for k in range(10)]  # 64 B, 256 B, ..., 16 MiB
QUICK_SIZES = [64, 4096, 262144, 2**20, 16 * 2**20]
RATIO_SIZE = 2**20  # 1 MiB: a step's worth of tensors, where bandwidth, not latency, rules
BYTES_PER_POINT = {False: 64 * 2**20, True: 32 * 2**20}  # per run; well past any cache
MAX_MESSAGES = {False: 20_000, True: 4_000}  # caps tiny messages, whose cost is per call
MIN_MESSAGES = 2
REPEATS = {False: 5, True: 3}
ROUND_TRIPS = {False: 2_000, True: 300}
RTT_SIZE = 64


def messages_for(size: int, quick: bool) -> int:
    return max(MIN_MESSAGES, min(MAX_MESSAGES[quick], BYTES_PER_POINT[quick] // size))


def _counters(procs: list[psutil.Process]) -> np.ndarray:
    """voluntary, involuntary context switches and CPU seconds, summed over procs."""
    total = np.zeros(3)
    for p in procs:
        cs, cpu = p.num_ctx_switches(), p.cpu_times()
        total += (cs.voluntary, cs.involuntary, cpu.user + cpu.system)
    return total


def _row(transport: str, size: int, count: int, times: list[float], counters: np.ndarray,
         **extra: Any) -> dict:
    nbytes = size * count
    runs = [nbytes / t / 1e9 for t in times]
    return {"metric": "bandwidth", "transport": transport, "size": size, "messages": count,
            "bytes": nbytes, "runs": len(times), "gbps": statistics.median(runs),
            "gbps_min": min(runs), "gbps_max": max(runs),
            "vol_cs": int(counters[0]), "invol_cs": int(counters[1]),
            "cpu_s_per_gb": float(counters[2]) / (nbytes * len(times) / 1e9),
            "copies_per_byte": COPIES_PER_BYTE[transport], **extra}


def _latency_row(transport: str, times: list[float]) -> dict:
    us = [t * 1e6 for t in times]
    return {"metric": "latency", "transport": transport, "size": RTT_SIZE, "round_trips": len(us),
            "p50_us": percentile(us, 50), "p99_us": percentile(us, 99)}


def private_ring(nbytes: int) -> memoryview:
    """Memory of this process alone, faulted in, in 4 KiB pages, and kept out of every child
    we fork: the shm ring's kind of memory, so that memcpy is the sender's copy exactly.

    Prefaulted, like the shm ring (np.zeros would not be: calloc leaves its pages unmapped
    until the first write). A plain mmap, not numpy: numpy asks for 2 MiB pages for large
    arrays (madvise), which the shm segment does not get (tmpfs, shmem_enabled); chapter 05
    measures what the page size is worth. MADV_DONTFORK, because each transport forks its sender: a page
    the child shares becomes copy-on-write, and the next memcpy sample took a fault on each of
    its 16,384 pages (54 ms instead of 7 at 1 MiB), inflating that round's ratio 7x."""
    ring = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_DONTFORK"):  # Linux
        ring.madvise(mmap.MADV_DONTFORK)
    view = memoryview(ring)
    np.frombuffer(view, np.uint8)[:] = 1
    return view


class MemcpySampler:
    """memcpy into a private ring as large as the shm ring, sampled once before the first
    transport and again after each one: on a shared machine a load spike then hits a few
    samples of every side of a ratio, not all the samples of one side."""

    def __init__(self, sizes: list[int], quick: bool):
        self.sizes, self.quick = sizes, quick
        self.ring = private_ring(RING_BYTES)
        self.src = memoryview(np.full(max(sizes), 7, np.uint8))
        self.me = [psutil.Process()]
        self.times: dict[int, list[float]] = {s: [] for s in sizes}
        self.counters = {s: np.zeros(3) for s in sizes}

    def sample(self) -> None:
        for size in self.sizes:
            self.time_one(size)

    def time_one(self, size: int) -> float:
        """One sample at `size`: seconds to copy messages_for(size) messages into the ring."""
        before, start = _counters(self.me), time.perf_counter()
        self.copy(size)
        seconds = time.perf_counter() - start
        self.times[size].append(seconds)
        self.counters[size] += _counters(self.me) - before
        return seconds

    def copy(self, size: int) -> None:
        count, slots, piece = messages_for(size, self.quick), slots_for(size), self.src[:size]
        for i in range(count):
            off = (i % slots) * size
            self.ring[off:off + size] = piece

    def rows(self) -> list[dict]:
        rows = [_row("memcpy", s, messages_for(s, self.quick), self.times[s], self.counters[s])
                for s in self.sizes]
        a, b = bytearray(RTT_SIZE), bytearray(b"p" * RTT_SIZE)
        times = []
        for _ in range(ROUND_TRIPS[self.quick]):  # the floor of a round trip: a copy there and back
            start = time.perf_counter()
            a[:] = b
            b[:] = a
            times.append(time.perf_counter() - start)
        return rows + [_latency_row("memcpy", times)]


def measure_transport(kind: str, sizes: list[int], quick: bool, bar,
                      memcpy: MemcpySampler | None = None) -> list[dict]:
    """Bandwidth at each size and the round-trip latency; at RATIO_SIZE, with `memcpy` given,
    the runs come in rounds against memcpy (_rounds)."""
    rows = []
    with Transport(kind) as t:
        procs = [psutil.Process(), psutil.Process(t.child.pid)]
        for size in sizes:
            count, dst = messages_for(size, quick), memoryview(np.zeros(size, np.uint8))
            t.bandwidth(dst, min(count, MIN_MESSAGES))  # warm up: first touches, slow start
            before, extra, lags = _counters(procs), {}, len(t.start_lags)
            if memcpy is not None and size == RATIO_SIZE:
                times, extra["vs_memcpy_rounds"] = _rounds(t, dst, count, quick, memcpy)
            else:
                times = [t.bandwidth(dst, count) for _ in range(REPEATS[quick])]
            extra["start_lag_ms"] = statistics.median(t.start_lags[lags:]) * 1e3
            if t.pipe_size:
                extra["pipe_size"] = t.pipe_size
            rows.append(_row(kind, size, count, times, _counters(procs) - before, **extra))
            bar.update()
        t.round_trips(RTT_SIZE, 10)  # warm up
        rows.append(_latency_row(kind, t.round_trips(RTT_SIZE, ROUND_TRIPS[quick])))
        bar.update()
    return rows


def _rounds(t: Transport, dst: memoryview, count: int, quick: bool,
            memcpy: MemcpySampler) -> tuple[list[float], list[float]]:
    """REPEATS rounds of memcpy, transport, transport, memcpy (a steady drift in the machine's
    speed cancels): each round's ratio is memcpy's seconds over the transport's. A burst of
    load from another program then moves both sides of one round, not one side of all."""
    size, times, ratios = len(dst), [], []
    memcpy.copy(size)  # warm up, as the transport was: the ring's lines in this core's caches
    for _ in range(REPEATS[quick]):
        limit = memcpy.time_one(size)
        pair = [t.bandwidth(dst, count), t.bandwidth(dst, count)]
        limit += memcpy.time_one(size)
        times += pair
        ratios.append(limit / sum(pair))
    return times, ratios


def ratios_of(rows: list[dict], size: int = RATIO_SIZE) -> dict[str, float]:
    """Each transport's bandwidth over memcpy's at `size`: the median of its interleaved rounds'
    ratios where the row has them (with KEY_spread, half their range over the median), else
    the ratio of the two medians."""
    at = {r["transport"]: r for r in rows if r["metric"] == "bandwidth" and r["size"] == size}
    if "memcpy" not in at:
        return {}
    ratios = {}
    for t in TRANSPORTS:
        if t not in at:
            continue
        rounds = at[t].get("vs_memcpy_rounds")
        if rounds:
            ratios[f"{t}_vs_memcpy"] = statistics.median(rounds)
            ratios[f"{t}_vs_memcpy_spread"] = spread(rounds)
        else:
            ratios[f"{t}_vs_memcpy"] = at[t]["gbps"] / at["memcpy"]["gbps"]
    return ratios


def run(quick: bool | None = None, sizes: list[int] | None = None,
        transports: list[str] | None = None, progress: bool = True) -> dict:
    """Measure everything; returns {"results": rows, "ratios": {...}} (no file written)."""
    quick = quick_mode() if quick is None else quick
    sizes = sizes or (QUICK_SIZES if quick else SIZES)
    transports = transports or TRANSPORTS
    with tqdm(total=(len(transports) + 1) * (len(sizes) + 1), desc="bench ipc", unit="point",
              disable=not progress, leave=False) as bar:
        memcpy, rows = MemcpySampler(sizes, quick), []
        memcpy.sample()
        bar.update(len(sizes) + 1)
        for kind in transports:
            bar.set_postfix_str(kind)
            rows += measure_transport(kind, sizes, quick, bar, memcpy)
            memcpy.sample()
        rows = memcpy.rows() + rows
    return {"results": rows, "ratios": ratios_of(rows), "quick": quick}


def fmt_size(n: int) -> str:
    for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n // scale} {unit}"
    return f"{n} B"


def findings(record: dict) -> list[str]:
    """The comparisons chapter 02 draws, as sentences about this run (not a reference's)."""
    rows = record["results"]
    lat = {r["transport"]: r["p50_us"] for r in rows if r["metric"] == "latency"}
    order = sorted((t for t in ("pipe", "unix", "tcp") if t in lat), key=lat.get)
    lines = ["on this machine, 64 B round trips: "
             + ", ".join(f"{t} {lat[t]:.0f} µs" for t in order) + " (fastest first)"]
    bw = {(r["transport"], r["size"]): r["gbps"] for r in rows if r["metric"] == "bandwidth"}
    for size in sorted({s for _, s in bw if s >= RATIO_SIZE}):
        unix, tcp = bw.get(("unix", size)), bw.get(("tcp", size))
        pipe, big = bw.get(("pipe", size)), bw.get(("pipe_big", size))
        if unix and tcp:
            lines.append(f"on this machine at {fmt_size(size)}: unix {unix:.2f} GB/s, tcp "
                         f"{tcp:.2f} GB/s: {'unix' if unix > tcp else 'tcp'} ahead by "
                         f"{max(unix, tcp) / min(unix, tcp):.2f}x")
        if pipe and big:
            lines.append(f"on this machine at {fmt_size(size)}: the 1 MiB pipe buffer moved "
                         f"{big / pipe:.2f}x the default pipe's GB/s")
    return lines


def print_report(record: dict) -> None:
    rows = record["results"]
    bw = [r for r in rows if r["metric"] == "bandwidth"]
    names = list(dict.fromkeys(r["transport"] for r in bw))
    sizes = sorted({r["size"] for r in bw})
    print("bandwidth, GB/s (median of runs) by message size:")
    grid = {(r["transport"], r["size"]): r["gbps"] for r in bw}
    print_table([{"transport": n, **{fmt_size(s): grid.get((n, s), "") for s in sizes}} for n in names],
                ["transport"] + [fmt_size(s) for s in sizes])
    lat = {r["transport"]: r for r in rows if r["metric"] == "latency"}
    at = {r["transport"]: r for r in bw if r["size"] == RATIO_SIZE}
    summary = []
    for n in names:
        row = {"transport": n, "copies/byte": COPIES_PER_BYTE[n]}
        if n in at:
            r, mib = at[n], at[n]["bytes"] * at[n]["runs"] / 2**20
            ratio = record["ratios"].get(f"{n}_vs_memcpy", r["gbps"] / at["memcpy"]["gbps"])
            row.update({"GB/s @1MiB": r["gbps"], "x memcpy": ratio,
                        "+-": record["ratios"].get(f"{n}_vs_memcpy_spread", ""),
                        "start lag ms": r.get("start_lag_ms", ""),
                        "vol cs/MiB": r["vol_cs"] / mib, "invol cs/MiB": r["invol_cs"] / mib,
                        "CPU s/GB": r["cpu_s_per_gb"]})
        if n in lat:
            row.update({"rtt p50 us": lat[n]["p50_us"], "rtt p99 us": lat[n]["p99_us"]})
        summary.append(row)
    print(f"\nsummary (x memcpy: the median of {REPEATS[record.get('quick', False)]} rounds of "
          f"memcpy, transport, transport, memcpy; +-: their spread, half the range over the "
          f"median; start lag: the sender's wake-up for the command, not timed; context "
          f"switches of both processes; load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}):")
    print_table(summary, ["transport", "GB/s @1MiB", "x memcpy", "+-", "start lag ms",
                          "rtt p50 us", "rtt p99 us",
                          "copies/byte", "vol cs/MiB", "invol cs/MiB"])


def plot(record: dict, path: str, title: str = "this machine", caption: str = "") -> None:
    """Bandwidth over message size, and round-trip latency, as one PNG; `caption` goes below."""
    import matplotlib
    if matplotlib.get_backend().lower().startswith("qt"):
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = record["results"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [3, 2]})
    for name in dict.fromkeys(r["transport"] for r in rows):
        pts = sorted((r["size"], r["gbps"]) for r in rows
                     if r["transport"] == name and r["metric"] == "bandwidth")
        left.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name,
                  linestyle="--" if name == "memcpy" else "-")
    left.set(xscale="log", yscale="log", xlabel="message size (bytes)", ylabel="GB/s",
             title=f"bandwidth between two processes ({title})")
    left.legend(fontsize=8)
    left.grid(True, which="both", alpha=0.3)
    lat = [r for r in rows if r["metric"] == "latency"]
    xs = np.arange(len(lat))
    right.bar(xs - 0.2, [r["p50_us"] for r in lat], 0.4, label="p50")
    right.bar(xs + 0.2, [r["p99_us"] for r in lat], 0.4, label="p99")
    right.set_xticks(xs, [r["transport"] for r in lat], rotation=30, fontsize=8)
    right.set(yscale="log", ylabel="microseconds", title=f"{RTT_SIZE} B round trip")
    right.legend(fontsize=8)
    caption = fill(caption, 150)
    fig.tight_layout(rect=(0, 0.02 + 0.04 * (caption.count("\n") + 1), 1, 1) if caption else None)
    if caption:
        fig.text(0.01, 0.015, caption, fontsize=8)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser("ipc", __doc__)
    parser.add_argument("--plot", metavar="FILE", help="draw bandwidth and latency into a PNG")
    args = parser.parse_args(argv)
    quick = args.quick or quick_mode()
    record = run(quick=quick)
    print_report(record)
    write_json(args.json, "ipc", record["results"], record["ratios"])
    if args.plot:
        plot(record, args.plot)
        print(f"wrote {args.plot}")
    return 0
