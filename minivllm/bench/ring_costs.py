"""What `bench ipc`'s shared-memory ring pays against memcpy at 1 MiB, piece by piece
(chapter 05, section 4.7).

    doorbell_rounds(rounds)   three ways for the in-place receiver to wait (VARIANTS), in
                              rounds against memcpy, with the receiver's sleeps per message
    memcpy_memory(rounds)     memcpy of the same bytes into three kinds of private memory:
                              numpy's (2 MiB pages where the kernel has them), plain 4 KiB
                              pages, and 4 KiB pages just after a fork (copy-on-write)
"""

from __future__ import annotations

import mmap
import os
import statistics
import time

import numpy as np
import psutil

from minivllm.bench.common import huge_page_share, page_faults
from minivllm.bench.ipc import RATIO_SIZE, MemcpySampler, messages_for, private_ring
from minivllm.bench._ipc_transports import RING_BYTES, Transport, slots_for

# receiver's (spin_s, recv_batch): sleep at once and ask for every message (the sender rings
# each one: the ring before issue 37); spin 2 ms first; sleep at once for a quarter of the ring
VARIANTS = {"a pipe byte per message": (0.0, 1), "spin 2 ms, then sleep": (0.002, 1),
            "batched: a quarter ring": (0.0, None)}


def doorbell_rounds(rounds: int, quick: bool, size: int = RATIO_SIZE) -> list[dict]:
    """Per variant: the median over rounds of memcpy's seconds over the ring's (each round
    memcpy, both variants in turn, memcpy), and the receiver's voluntary context switches
    (sleeps) per message."""
    count, memcpy = messages_for(size, quick), MemcpySampler([size], quick)
    got = {name: {"ratios": [], "sleeps": 0} for name in VARIANTS}
    me = psutil.Process()
    with Transport("shm") as t:
        dst = memoryview(np.zeros(size, np.uint8))
        t.bandwidth(dst, count)  # warm up: the sender's pages and both caches
        memcpy.copy(size)
        for r in range(rounds):
            order = list(VARIANTS)[r % len(VARIANTS):] + list(VARIANTS)[:r % len(VARIANTS)]
            limit, seconds = memcpy.time_one(size), {}
            for name in order:
                t.chan.spin_s, t.chan.recv_batch = VARIANTS[name]
                before = me.num_ctx_switches().voluntary
                seconds[name] = t.bandwidth(dst, count)
                got[name]["sleeps"] += me.num_ctx_switches().voluntary - before
            limit = (limit + memcpy.time_one(size)) / 2
            for name in VARIANTS:
                got[name]["ratios"].append(limit / seconds[name])
    return [{"receiver": name, "x memcpy": statistics.median(g["ratios"]),
             "rounds": [round(x, 3) for x in g["ratios"]],
             "sleeps/message": g["sleeps"] / (rounds * count)} for name, g in got.items()]


def _copy_into(ring: memoryview, src: memoryview, count: int) -> float:
    size, slots = len(src), slots_for(len(src))
    start = time.perf_counter()
    for i in range(count):
        off = (i % slots) * size
        ring[off:off + size] = src
    return time.perf_counter() - start


def memcpy_memory(rounds: int, quick: bool, size: int = RATIO_SIZE) -> list[dict]:
    """GB/s and page faults of memcpy in `size` pieces through a RING_BYTES ring of three kinds
    of memory. The first two take turns each round; the fork case comes after them (a fork
    write-protects every page of this process, numpy's ring too) and copies while a forked
    child still shares the pages, as a transport's forked sender does."""
    count, src = messages_for(size, quick), memoryview(np.full(size, 7, np.uint8))
    numpy_ring = np.ones(RING_BYTES, np.uint8)
    cases = {"numpy (np.ones)": memoryview(numpy_ring), "4 KiB pages (mmap)": private_ring(RING_BYTES)}
    times = {name: [] for name in [*cases, "4 KiB, after a fork"]}
    faults = {name: [] for name in times}
    for _ in range(rounds):
        for name, ring in cases.items():
            before = page_faults()
            times[name].append(_copy_into(ring, src, count))
            faults[name].append(page_faults() - before)
    share = huge_page_share(numpy_ring[RING_BYTES // 2:].ctypes.data)  # its first page is a
    # mapping of its own (the malloc header before numpy's madvise), so ask about the middle
    for _ in range(rounds):
        seconds, faulted = _copy_after_fork(src, count)
        times["4 KiB, after a fork"].append(seconds)
        faults["4 KiB, after a fork"].append(faulted)
    return [{"memory": name, "GB/s": count * size / statistics.median(times[name]) / 1e9,
             "faults/copy": statistics.median(faults[name]),
             "2 MiB pages": f"{share:.0%}" if name.startswith("numpy") and share is not None
             else "0%"} for name in times]


def _copy_after_fork(src: memoryview, count: int) -> tuple[float, int]:
    """Seconds and page faults of the copies into a prefaulted 4 KiB ring that a forked child
    shares."""
    shared = mmap.mmap(-1, RING_BYTES, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    view = memoryview(shared)
    np.frombuffer(view, np.uint8)[:] = 1
    child = os.fork()
    if child == 0:  # holds the pages until the parent has copied
        time.sleep(60)
        os._exit(0)
    try:
        before = page_faults()
        return _copy_into(view, src, count), page_faults() - before
    finally:
        os.kill(child, 9)
        os.waitpid(child, 0)
        view.release()
        shared.close()
