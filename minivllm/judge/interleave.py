"""Deterministic interleaving exploration, in the manner of CHESS and loom.

Threads run one at a time. Every load or store on an `InstrumentedBuffer` is a scheduling
point where the controller decides which thread performs the next access. A run is fully
determined by its list of decisions, so the search is stateless: run a schedule, then for
every decision after the forced prefix, queue the other threads that could have gone there,
as long as the number of preemptions (switching away from a thread that could have gone on)
stays within the bound. A failing schedule replays exactly and prints as a numbered timeline.

A thread that polls and finds nothing to do calls `ctx.block()`: it sleeps until another
thread stores, which keeps spin loops from making the search infinite. When every unfinished
thread is blocked, the run is a deadlock.
"""

from __future__ import annotations

import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable

CONTROLLER = -1
MAX_STEPS = 20_000  # per run; beyond this a run is called a livelock


class Abort(BaseException):
    """Unwinds a thread when its run is over. BaseException, so `except Exception` can't eat it."""


class Violation(Exception):
    """Raised by a thread (or the final check) when the behaviour is wrong."""


@dataclass
class Event:
    thread: str
    text: str


@dataclass
class RunResult:
    decisions: list[tuple[frozenset, int, int, int]]  # (enabled, prev, chosen, preemptions before)
    events: list[Event]
    failure: str | None = None


@dataclass
class SearchResult:
    runs: int
    failure: RunResult | None
    exhausted: bool
    seconds: float
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

    def point(self, text: str, is_store: bool, action: Callable[[], object]) -> object:
        return self._run.point(self.tid, text, is_store, action)

    def block(self) -> None:
        self._run.block(self.tid)

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
        return view

    def __len__(self) -> int:
        return len(self.data)

    def _where(self, key) -> str:
        start = key.start if isinstance(key, slice) else key
        name = self.label(start or 0)
        return f"   ({name})" if name else ""

    def __getitem__(self, key):
        if isinstance(key, slice):
            text, read = f"load  buf[{key.start}:{key.stop}]", lambda: bytes(self.data[key])
        else:
            text, read = f"load  buf[{key}]", lambda: self.data[key]
        return self.ctx.point(text + self._where(key), False, read)

    def __setitem__(self, key, value) -> None:
        if isinstance(key, slice):
            text = f"store buf[{key.start}:{key.stop}] = {bytes(value)!r}"
        else:
            text = f"store buf[{key}] = {value}"

        def store():
            self.data[key] = value
        self.ctx.point(text + self._where(key), True, store)


class _Run:
    """One execution of the threads under one schedule prefix.

    Hand-off: a thread at a scheduling point releases the controller's semaphore and waits
    on its own; the controller picks the next thread and releases that thread's semaphore.
    So exactly one of them runs at any moment.
    """

    def __init__(self, names: list[str], prefix: list[int]):
        self.names, self.prefix = names, prefix
        self.control = threading.Semaphore(0)
        self.turn = [threading.Semaphore(0) for _ in names]
        self.finished = [False] * len(names)
        self.blocked = [False] * len(names)
        self.events: list[Event] = []
        self.decisions: list[tuple[frozenset, int, int, int]] = []
        self.failure: str | None = None
        self.aborting = False

    # --- called from the threads ---------------------------------------------------------
    def _wait_turn(self, tid: int) -> None:
        self.control.release()
        self.turn[tid].acquire()
        if self.aborting:
            raise Abort()

    def point(self, tid: int, text: str, is_store: bool, action) -> object:
        self._wait_turn(tid)
        result = action()
        shown = f" -> {result!r}" if not is_store else ""
        self.events.append(Event(self.names[tid], text + shown))
        if is_store:
            self.blocked = [False] * len(self.names)  # a store may be what a waiter needs
        return result

    def block(self, tid: int) -> None:
        self.blocked[tid] = True
        self._wait_turn(tid)

    def thread_main(self, tid: int, body: Callable[[Context], None]) -> None:
        try:
            self._wait_turn(tid)
            body(Context(self, tid))
        except Abort:
            return
        except Violation as exc:
            self.fail(f"{self.names[tid]}: {exc}")
        except Exception:
            self.fail(f"{self.names[tid]} raised:\n{traceback.format_exc(limit=-3)}")
        self.finished[tid] = True
        self.control.release()

    def fail(self, message: str) -> None:
        if self.failure is None:
            self.failure = message

    # --- the controller ------------------------------------------------------------------
    def choose(self, prev: int) -> int | None:
        enabled = frozenset(i for i in range(len(self.names))
                            if not self.finished[i] and not self.blocked[i])
        if not enabled:
            return None
        k = len(self.decisions)
        default = prev if prev in enabled else min(enabled)
        chosen = self.prefix[k] if k < len(self.prefix) else default
        preemptions = 0
        if self.decisions:
            e, p, c, n = self.decisions[-1]
            preemptions = n + (1 if p in e and c != p else 0)
        self.decisions.append((enabled, prev, chosen, preemptions))
        return chosen

    def drive(self, bodies: list[Callable[[Context], None]]) -> None:
        threads = [threading.Thread(target=self.thread_main, args=(i, b), daemon=True)
                   for i, b in enumerate(bodies)]
        for t in threads:
            t.start()
        for _ in threads:  # every thread parked at its start line
            self.control.acquire()
        prev = 0
        for _ in range(MAX_STEPS):
            if self.failure is not None or all(self.finished):
                break
            nxt = self.choose(prev)
            if nxt is None:
                waiting = [self.names[i] for i in range(len(self.names)) if not self.finished[i]]
                self.fail("deadlock: " + " and ".join(waiting) + " are all waiting, and nobody "
                          "will store anything they could wake up for. A real run would hang "
                          "here until it timed out.")
                break
            prev = nxt
            self.turn[nxt].release()
            self.control.acquire()  # the thread reached its next point, or finished
        else:
            self.fail(f"no progress after {MAX_STEPS} steps (livelock)")
        self.aborting = True
        for i, t in enumerate(threads):
            self.turn[i].release()
            t.join(timeout=5)


def explore(thread_names: list[str], make_bodies: Callable[[], list[Callable[[Context], None]]],
            final_check: Callable[[], None] = lambda: None, preemption_bound: int = 2,
            max_runs: int = 20_000, time_budget_s: float = 8.0) -> SearchResult:
    """Search schedules depth-first; stop at the first failing one.

    make_bodies() builds fresh state and returns one callable per thread; final_check()
    runs after a run in which every thread finished and raises Violation if the end state
    is wrong.
    """
    start = time.monotonic()
    stack: list[list[int]] = [[]]
    runs = 0
    while stack and runs < max_runs and time.monotonic() - start < time_budget_s:
        prefix = stack.pop()
        run = _Run(thread_names, prefix)
        run.drive(make_bodies())
        runs += 1
        if run.failure is None:
            try:
                final_check()
            except Violation as exc:
                run.fail(str(exc))
        if run.failure is not None:
            result = RunResult(run.decisions, run.events, run.failure)
            return SearchResult(runs, result, False, time.monotonic() - start, thread_names)
        _push_alternatives(stack, run.decisions, len(prefix), preemption_bound)
    return SearchResult(runs, None, not stack, time.monotonic() - start, thread_names)


def _push_alternatives(stack, decisions, from_index: int, bound: int) -> None:
    chosen = [d[2] for d in decisions]
    # Push deeper alternatives last, so the search goes depth-first.
    for j in range(from_index, len(decisions)):
        enabled, prev, pick, before = decisions[j]
        for alt in sorted(enabled - {pick}, reverse=True):
            cost = before + (1 if prev in enabled and alt != prev else 0)
            if cost <= bound:
                stack.append(chosen[:j] + [alt])
