"""Deterministic interleaving exploration, in the manner of CHESS and loom.

Threads run one at a time. Every load or store on an `InstrumentedBuffer` is a scheduling
point where the scheduler decides which thread performs the next access. A run is fully
determined by its list of decisions, so the search is stateless: run a schedule, then for
every decision after the forced prefix, queue the other threads that could have gone there,
as long as the number of preemptions (switching away from a thread that could have gone on)
stays within the bound. A failing schedule replays exactly and prints as a numbered timeline.

The search is bounded by a number of schedules, never by seconds, so its verdict is the same
on every machine: `SearchResult.finished` says whether it explored every schedule within the
bound. Two things keep it small:
- state caching: a thread's next move depends only on what it has loaded so far, so the state
  at a decision point is the buffer's bytes plus each thread's history of accesses (hashed).
  A run that reaches a state already reached with no more preemptions stops there: what can
  follow was (or will be) explored from the first visit. Interleavings that differ only in
  the order of independent accesses meet in one state.
- direct hand-off: the running thread picks the next one itself, and continuing costs no
  thread switch.

A thread that polls and finds nothing to do calls `ctx.block()`: it sleeps until another
thread stores, which keeps spin loops from making the search infinite. When every unfinished
thread is blocked, the run is a deadlock.
"""

from __future__ import annotations

import _thread
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable

MAX_STEPS = 20_000  # per run; beyond this a run is called a livelock
MAX_RUNS = 200_000  # per search; a scenario needing more is too big to grade


class Abort(BaseException):
    """Unwinds a thread when its run is over. BaseException, so `except Exception` can't eat it."""


class Violation(Exception):
    """Raised by a thread (or the final check) when the behaviour is wrong."""


class Event:
    """One line of a timeline; its text is built only if the timeline is shown."""

    def __init__(self, thread: str, text: str | Callable[[], str], result: object = None,
                 shown: bool = False):
        self.thread, self._text, self.result, self.shown = thread, text, result, shown

    @property
    def text(self) -> str:
        text = self._text if isinstance(self._text, str) else self._text()
        return text + (f" -> {self.result!r}" if self.shown else "")


Decision = tuple[frozenset, int, int, int]  # (enabled, prev, chosen, preemptions before)


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


class Context:
    """What a thread body sees: the scheduler's point(), block() and note()."""

    def __init__(self, run: "_Run", tid: int):
        self._run, self.tid = run, tid

    def point(self, text: str | Callable[[], str], is_store: bool,
              op: Callable[[bytearray], object], data: bytearray, span: tuple[int, int]) -> object:
        """One access to bytes span of data: op(data) loads or stores; text (or a callable
        making it) describes it in the timeline. op must touch nothing but data[span], so the
        search can try it ahead."""
        return self._run.point(self.tid, text, is_store, op, data, span)

    def block(self, since: tuple[int, int, int] | None = None) -> None:
        """Sleep until another thread stores. since=checkpoint(): the thread declares that
        what it did since then changed nothing (it only polled). Then its state is the one
        it had at the checkpoint, and it sleeps until a store changes a byte the poll loaded
        (polling again before that would load the same bytes and fail the same way)."""
        self._run.block(self.tid, since)

    def checkpoint(self) -> tuple[int, int, int]:
        run = self._run
        return run.history[self.tid], run.stores[self.tid], len(run.loads[self.tid])

    def note(self, text: str) -> None:
        self._run.events.append(Event(self._run.names[self.tid], text))


class InstrumentedBuffer:
    """A bytearray whose every item or slice access is a scheduling point.

    Supports buf[i], buf[i] = v, buf[a:b], buf[a:b] = data and len(buf): the operations a
    ring buffer needs. `label(offset)` names a byte for the timeline ("chunk 0 written flag").
    """

    def __init__(self, size: int, label: Callable[[int], str] = lambda off: ""):
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
        name = self.label((key.start if isinstance(key, slice) else key) or 0)
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


class _Run:
    """One execution of the threads under one schedule prefix.

    Exactly one thread runs at a time. At each scheduling point the running thread chooses
    who goes next; if that is another thread, it releases that thread's semaphore and waits
    on its own. The main thread only starts the run and waits for its end.
    """

    def __init__(self, names: list[str], prefix: list[int], visited: dict | None):
        self.names, self.prefix, self.visited = names, prefix, visited
        n = len(names)
        self.turn = [_held_lock() for _ in names]
        self.done = _held_lock()
        self.finished, self.blocked = [False] * n, [False] * n
        self.history = [0] * n  # hash of each thread's accesses and what its loads returned
        self.stores = [0] * n
        self.loads: list[list[tuple]] = [[] for _ in names]  # (id(data), lo, hi) loaded, per thread
        self.watch: list[frozenset | None] = [None] * n  # a blocked poller wakes on these
        self.pending: list[tuple | None] = [None] * n  # (is_store, op, data, span) waited at
        self.shared: list[bytearray] = []
        self.events: list[Event] = []
        self.decisions: list[Decision] = []
        self.successors: list[dict[int, tuple]] = []  # per decision: alternative -> its state
        self.failure: str | None = None
        self.pruned = False
        self.aborting = False

    def share(self, data: bytearray) -> None:
        if not any(d is data for d in self.shared):
            self.shared.append(data)

    # --- scheduling ------------------------------------------------------------------------
    def _choose(self, prev: int) -> int | None:
        """Record a decision: who does the next access. None: nobody can (the run is over)."""
        enabled = frozenset(i for i in range(len(self.names))
                            if not self.finished[i] and not self.blocked[i])
        if not enabled:
            return None
        k = len(self.decisions)
        if k >= MAX_STEPS:
            self.fail(f"no progress after {MAX_STEPS} steps (livelock)")
            return None
        preemptions = 0
        if self.decisions:
            e, p, c, n = self.decisions[-1]
            preemptions = n + (1 if p in e and c != p else 0)
        if k >= len(self.prefix) and self.visited is not None:
            key = self._key(prev, self.history, self.blocked, self.shared)
            best = self.visited.get(key)
            if best is not None and best <= preemptions and k > len(self.prefix):
                self.pruned = True
                return None
            if best is None or preemptions < best:
                self.visited[key] = preemptions
        chosen = self.prefix[k] if k < len(self.prefix) else (prev if prev in enabled
                                                             else min(enabled))
        self.decisions.append((enabled, prev, chosen, preemptions))
        if k >= len(self.prefix) and self.visited is not None:
            self.successors.append({t: self._successor(t) for t in enabled - {chosen}})
        else:
            self.successors.append({})
        return chosen

    def _key(self, prev, history, blocked, shared) -> tuple:
        watch = tuple(w if b else None for w, b in zip(self.watch, blocked))
        return (prev, tuple(history), tuple(blocked), watch, tuple(self.finished),
                *(bytes(b) for b in shared))

    def _woken(self, data, span) -> list[bool]:
        """The blocked flags after a store to data[span]: it wakes whoever may care."""
        lo, hi = span
        return [b and self.watch[i] is not None and not any(
                    d == id(data) and lo < h and l < hi for d, l, h in self.watch[i])
                for i, b in enumerate(self.blocked)]

    def _successor(self, t: int) -> tuple | None:
        """The state key right after thread t does the access it waits at (None: unknown)."""
        if self.pending[t] is None:
            return None
        is_store, op, data, span = self.pending[t]
        shared = [bytearray(d) if d is data else d for d in self.shared]
        result = op(shared[next(i for i, d in enumerate(self.shared) if d is data)])
        history = list(self.history)
        history[t] = hash((history[t], is_store, result))
        blocked = self._woken(data, span) if is_store else self.blocked
        return self._key(t, history, blocked, shared)

    def _switch(self, tid: int) -> None:
        """Thread tid gives up the CPU: pick the next thread, hand over, wait for our turn."""
        nxt = self._choose(tid)
        if nxt is None:
            self._end()
        if nxt != tid:
            self.turn[nxt].release()
            self.turn[tid].acquire()
        if self.aborting:
            raise Abort()

    def _end(self) -> None:
        if self.failure is None and not self.pruned and not all(self.finished):
            waiting = [self.names[i] for i in range(len(self.names)) if not self.finished[i]]
            verb = "is waiting" if len(waiting) == 1 else "are all waiting"
            self.fail(f"deadlock: {' and '.join(waiting)} {verb}, and nobody will store "
                      "anything they could wake up for. A real run would hang here until it "
                      "timed out.")
        if not self.aborting:
            self.aborting = True
            self.done.release()
        raise Abort()

    # --- called from the threads -------------------------------------------------------------
    def point(self, tid: int, text, is_store: bool, op, data, span) -> object:
        if self.aborting:  # a finally: in the thread's code, after the run ended
            raise Abort()
        self.pending[tid] = (is_store, op, data, span)
        self._switch(tid)
        self.pending[tid] = None
        result = op(data)
        self.history[tid] = hash((self.history[tid], is_store, result))
        self.events.append(Event(self.names[tid], text, result, not is_store))
        if is_store:
            self.stores[tid] += 1
            self.blocked = self._woken(data, span)  # a store may be what a waiter needs
        else:
            self.loads[tid].append((id(data), *span))
        return result

    def block(self, tid: int, since: tuple[int, int, int] | None = None) -> None:
        if self.aborting:
            raise Abort()
        self.blocked[tid] = True
        self.watch[tid] = None  # unknown: wake on any store
        if since is not None and since[1] == self.stores[tid]:  # no store since: only polled
            self.history[tid] = since[0]
            self.watch[tid] = frozenset(self.loads[tid][since[2]:])
        self.loads[tid].clear()
        self.history[tid] = hash((self.history[tid], "block"))
        self._switch(tid)

    def thread_main(self, tid: int, body: Callable[[Context], None]) -> None:
        try:
            self.turn[tid].acquire()  # parked at the start line until first chosen
            if self.aborting:
                return
            body(Context(self, tid))
            self.finished[tid] = True
            self.history[tid] = hash((self.history[tid], "end"))
            nxt = self._choose(tid)
            if nxt is None:
                self._end()
            self.turn[nxt].release()
        except Abort:
            return
        except Violation as exc:
            self._fail_and_end(f"{self.names[tid]}: {exc}")
        except Exception:
            self._fail_and_end(f"{self.names[tid]} raised:\n{traceback.format_exc(limit=-3)}")

    def _fail_and_end(self, message: str) -> None:
        self.fail(message)
        try:
            self._end()
        except Abort:
            pass

    def fail(self, message: str) -> None:
        if self.failure is None:
            self.failure = message

    def drive(self, workers: "_Workers", bodies: list[Callable[[Context], None]]) -> None:
        workers.start(self, bodies)
        first = self._choose(0)
        self.turn[first].release()
        self.done.acquire()
        for turn in self.turn:  # wake every parked thread: it sees `aborting` and unwinds
            if turn.locked():
                turn.release()
        workers.wait_idle()


def _held_lock():
    """A binary semaphore at 0: a raw lock, released by whoever hands over the turn (a raw
    lock may be released by any thread; threading.Semaphore costs several times more)."""
    lock = _thread.allocate_lock()
    lock.acquire()
    return lock


class _Workers:
    """The threads that run the bodies, kept from one run to the next (starting a thread
    costs more than a whole short run)."""

    def __init__(self, n: int):
        self.go = [_held_lock() for _ in range(n)]
        self.idle = [_held_lock() for _ in range(n)]
        self.jobs: list = [None] * n
        self.threads = [threading.Thread(target=self._loop, args=(i,), daemon=True)
                        for i in range(n)]
        for t in self.threads:
            t.start()

    def _loop(self, i: int) -> None:
        while True:
            self.go[i].acquire()
            if self.jobs[i] is None:
                return
            run, body = self.jobs[i]
            run.thread_main(i, body)
            self.idle[i].release()

    def start(self, run: _Run, bodies) -> None:
        for i, body in enumerate(bodies):
            self.jobs[i] = (run, body)
            self.go[i].release()

    def wait_idle(self) -> None:
        for idle in self.idle:
            idle.acquire()

    def stop(self) -> None:
        self.jobs = [None] * len(self.threads)
        for go in self.go:
            go.release()
        for t in self.threads:
            t.join(timeout=5)


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
    workers = _Workers(len(thread_names))
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
        run = _Run(thread_names, prefix, visited)
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


def _push_alternatives(stack, run: _Run, from_index: int, bound: int, visited) -> None:
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
