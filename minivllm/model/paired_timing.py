"""Two versions of one piece of work timed side by side, so that a neighbour's load cancels.

A round takes one sample of each version, back to back; the ratio of the two samples is kept
per round and the median of the ratios decides. A burst that hits one side of one round moves
one ratio, not the median. A sample repeats the call until the slower side's lasts SAMPLE_S.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Callable

ROUNDS = (5, 11)  # samples of each side, at least and at most
BUDGET_S = 0.05  # rounds stop once past this (and ROUNDS[0])
SAMPLE_S = 1e-3  # a sample repeats the call until the slower side's lasts about this long


def paired_ratio(a: Callable[[], object], b: Callable[[], object],
                 budget_s: float = BUDGET_S) -> tuple[float, float, float]:
    """a and b timed in alternation, after a warm-up: (median of the rounds' a/b ratios, median
    seconds per call of a, of b)."""
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


def _once(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start
