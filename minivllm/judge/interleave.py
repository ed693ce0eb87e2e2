"""Deterministic interleaving exploration, in the manner of CHESS and loom.

Threads run one at a time. Every load or store on an `InstrumentedBuffer` is a scheduling
point where the scheduler decides which thread performs the next access. A run is fully
determined by its list of decisions, so the search is stateless: run a schedule, then for
every decision after the forced prefix, queue the other threads that could have gone there,
as long as the number of preemptions (switching away from a thread that could have gone on)
stays within the bound. A failing schedule replays exactly and prints as a numbered timeline.

The search is bounded by a number of schedules, never by seconds, so its verdict is the same
on every machine: `SearchResult.finished` says whether it explored every schedule within the
bound. What keeps it small:
- state caching: a thread's next move depends only on what it has loaded so far, so the state
  at a decision point is the buffer's bytes plus each thread's history of accesses (hashed).
  A run that reaches a state already reached with no more preemptions stops there: what can
  follow was (or will be) explored from the first visit. Interleavings that differ only in
  the order of independent accesses meet in one state. An alternative whose first access
  leads to a state already explored or queued is not queued at all.
- polls that found nothing: a thread calls `ctx.block(since=ctx.checkpoint())` when its poll
  stored nothing and changed none of its own state. Its state is then the one before the
  poll, and it sleeps until another thread stores to a byte the poll loaded (any other store
  would make it poll again and find nothing again). `ctx.block()` alone sleeps until any store.
  When every unfinished thread is blocked, the run is a deadlock.
- direct hand-off: the running thread picks the next one itself, continuing costs no thread
  switch, and the threads are kept from one run to the next (schedule.py runs them).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from minivllm.judge.schedule import Context, Decision, Event, Run, Violation, Workers

__all__ = ["Context", "InstrumentedBuffer", "SearchResult", "Violation", "explore"]

MAX_RUNS = 200_000  # per search; a scenario needing more is too big to grade


@dataclass
class RunResult:
    decisions: list[Decision]
    events: list[Event]
    failure: str | None = None


@dataclass
class SearchResult:
    runs: int  # schedules run, pruned ones included
    failure: RunResult | None
    finished: bool  # every schedule within the bound was explored (or a failure was found)
    seconds: float
    pruned: int = 0  # runs stopped early in a state already explored
    thread_names: list[str] = field(default_factory=list)

    def timeline(self, last: int = 60) -> str:
        """The failing run as a numbered list: who loaded or stored what, and what followed."""
        events = self.failure.events if self.failure else []
        start = max(0, len(events) - last)
        width = max((len(n) for n in self.thread_names), default=6)
        lines = [f"  ... {start} earlier steps not shown"] if start else []
        lines += [f"  {i + 1:3d}. {e.thread:<{width}}  {e.text}"
                  for i, e in enumerate(events[start:], start)]
        return "\n".join(lines)


class InstrumentedBuffer:
    """A bytearray whose every item or slice access is a scheduling point.

    Supports buf[i], buf[i] = v, buf[a:b], buf[a:b] = data and len(buf): the operations a
    ring buffer needs. `label(start, stop)` names the bytes start..stop-1 of an access for the
    timeline ("chunk 0 written flag", "chunk 0 read flags of readers 0-1").
    """

    def __init__(self, size: int, label: Callable[[int, int], str] = lambda start, stop: ""):
        self.data = bytearray(size)
        self.label = label
        self.ctx: Context | None = None  # set per thread through `bind`

    def bind(self, ctx: Context) -> "InstrumentedBuffer":
        view = object.__new__(InstrumentedBuffer)
        view.data, view.label, view.ctx = self.data, self.label, ctx
        ctx._run.share(self.data)
        return view

    def __len__(self) -> int:
        return len(self.data)

    def _text(self, key, value=None) -> str:
        where = f"[{key.start}:{key.stop}]" if isinstance(key, slice) else f"[{key}]"
        name = self.label(*self._span(key))
        name = f"   ({name})" if name else ""
        if value is None:
            return f"load  buf{where}{name}"
        return f"store buf{where} = {value!r}{name}"

    def __getitem__(self, key):
        op = (lambda d: bytes(d[key])) if isinstance(key, slice) else (lambda d: d[key])
        return self.ctx.point(lambda: self._text(key), False, op, self.data, self._span(key))

    def __setitem__(self, key, value) -> None:
        if isinstance(key, slice):
            value = bytes(value)  # a snapshot: the caller may change its buffer afterwards

        def op(d):
            d[key] = value
        self.ctx.point(lambda: self._text(key, value), True, op, self.data, self._span(key))

    def _span(self, key) -> tuple[int, int]:
        if isinstance(key, slice):
            start, stop, _ = key.indices(len(self.data))
            return start, max(start, stop)
        return key % len(self.data), key % len(self.data) + 1


def explore(thread_names: list[str], make_bodies: Callable[[], list[Callable[[Context], None]]],
            final_check: Callable[[], None] = lambda: None, preemption_bound: int = 2,
            max_runs: int = MAX_RUNS, cache_states: bool = True) -> SearchResult:
    """Search schedules depth-first; stop at the first failing one, or after max_runs.

    make_bodies() builds fresh state and returns one callable per thread; final_check()
    runs after a run in which every thread finished and raises Violation if the end state
    is wrong.
    """
    start = time.monotonic()
    visited: dict | None = {} if cache_states else None
    workers = Workers(len(thread_names))
    try:
        return _search(thread_names, make_bodies, final_check, preemption_bound, max_runs,
                       visited, workers, start)
    finally:
        workers.stop()


def _search(thread_names, make_bodies, final_check, preemption_bound, max_runs, visited,
            workers, start) -> SearchResult:
    stack: list[list[int]] = [[]]
    runs = pruned = 0
    while stack and runs < max_runs:
        prefix = stack.pop()
        run = Run(thread_names, prefix, visited)
        run.drive(workers, make_bodies())
        runs += 1
        pruned += run.pruned
        if run.failure is None and not run.pruned:
            try:
                final_check()
            except Violation as exc:
                run.fail(str(exc))
        if run.failure is not None:
            result = RunResult(run.decisions, run.events, run.failure)
            return SearchResult(runs, result, True, time.monotonic() - start, pruned, thread_names)
        _push_alternatives(stack, run, len(prefix), preemption_bound, visited)
    return SearchResult(runs, None, not stack, time.monotonic() - start, pruned, thread_names)


def _push_alternatives(stack, run: Run, from_index: int, bound: int, visited) -> None:
    """Queue, for each decision past the prefix, the other threads that could have gone there
    within the bound, unless the state that choice leads to is already explored or queued."""
    chosen = [d[2] for d in run.decisions]
    # Push deeper alternatives last, so the search goes depth-first.
    for j in range(from_index, len(run.decisions)):
        enabled, prev, pick, before = run.decisions[j]
        for alt in sorted(enabled - {pick}, reverse=True):
            cost = before + (1 if prev in enabled and alt != prev else 0)
            if cost > bound:
                continue
            key = run.successors[j].get(alt)
            if key is not None:
                best = visited.get(key)
                if best is not None and best <= cost:
                    continue
                visited[key] = cost
            stack.append(chosen[:j] + [alt])
