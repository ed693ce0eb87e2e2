"""One run of threads under a schedule: the machinery under interleave.explore.

Exactly one thread runs at a time. Every access to shared memory is a scheduling point where
the running thread records a decision (who goes next) and, if that is another thread, hands
over the turn. A run replays a prefix of decisions, then goes on with the default choice
(the same thread while it can), recording the state at each new decision for the search.
"""

from __future__ import annotations

import _thread
import threading
import traceback
from typing import Callable

MAX_STEPS = 20_000  # per run; beyond this a run is called a livelock


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


class Context:
    """What a thread body sees: the scheduler's point(), block() and note()."""

    def __init__(self, run: "Run", tid: int):
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


class Run:
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
        self.loads: list[list[tuple]] = [[] for _ in names]  # (buffer, lo, hi) loaded, per thread
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

    def _buffer(self, data: bytearray) -> int:
        """Which shared buffer: its index, the same in every run (an id() is not)."""
        return next(i for i, d in enumerate(self.shared) if d is data)

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
                    d == self._buffer(data) and lo < h and l < hi for d, l, h in self.watch[i])
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
            self.loads[tid].append((self._buffer(data), *span))
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

    def drive(self, workers: "Workers", bodies: list[Callable[[Context], None]]) -> None:
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


class Workers:
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

    def start(self, run: Run, bodies) -> None:
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
