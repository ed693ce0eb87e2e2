"""The judge's tests for exercise 411. Each receives the learner's module as `impl`.

Workers are real processes. The first test runs the learner's worker_main in a process the
judge starts, with the judge's queues; the rest drive the learner's Executor. Times are
generous bounds (a death must fail a pending call well before its own deadline), never
measurements.
"""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.connection
import multiprocessing.process
import multiprocessing.queues
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

import psutil

from minivllm.judge.api import Fail, check_equal, kill_if_alive, scaled, step, test

WAIT_S = scaled(20.0)  # a reply or a process start that takes this long is lost
HANG_S = scaled(3.0)  # a call that should end at once (or within a second of a death) hangs
POLL_S = 0.1  # the README's POLL_S: the longest slice a pending call may wait in
JOIN_S = 1.0  # the README's JOIN_S: the longest join shutdown() may give a worker


def _raises(fn, exc_type, must_contain, what):
    """Call fn; it must raise exc_type whose message holds every string in must_contain."""
    try:
        got = fn()
    except exc_type as e:
        missing = [s for s in must_contain if s not in str(e)]
        if missing:
            raise Fail(f"{what}: the {exc_type.__name__} must say {missing}",
                       expected=f"a message with {must_contain}", got=str(e))
        return str(e)
    except Fail:
        raise
    except Exception as e:
        raise Fail(f"{what} must raise {exc_type.__name__}", got=repr(e))
    raise Fail(f"{what} must raise {exc_type.__name__}", got=got)


def _returns(fn, what, why, recorded=None, limit=HANG_S, impl=None):
    """fn() in a thread; Fail naming `what` and why(), not a bare time-out, if it hangs (with
    the line of impl's file it waits at). With `recorded`, the thread's waits are recorded, and
    a wait that breaks the README's rule fails at once (recorded.broken), not at the limit."""
    out, wake = {}, threading.Event()

    def run():
        if recorded is not None:
            recorded.watch(threading.get_ident(), wake)
        out.update(_outcome(fn))
        wake.set()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    wake.wait(limit)
    if not out and recorded is not None and recorded.broken:
        raise Fail(f"{what}: {recorded.broken}", got=recorded.shown())
    if not out:
        raise Fail(f"{what} was still waiting {limit:g} s later{_where(thread, impl)}: {why()}")
    if "error" in out:
        raise out["error"]
    return out["value"]


def _where(thread, impl) -> str:
    """' (at FUNCTION() line N: SOURCE)': the last line of impl's file in thread's stack."""
    frame = sys._current_frames().get(thread.ident) if impl is not None else None
    mine = [f for f in traceback.extract_stack(frame) if f.filename == impl.__file__] \
        if frame is not None else []
    return f" (at {mine[-1].name}() line {mine[-1].lineno}: {mine[-1].line})" if mine else ""


def _dying(pid: int) -> bool:
    """Whether pid is on its way out, not hung: a hung worker sleeps in its call; a killed one
    is woken to run its exit, or is a zombie, until it is reaped."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_SLEEPING
    except psutil.NoSuchProcess:
        return True


def _still_runs(pid: int) -> bool:
    """Whether pid has not exited. A join can return with no exit code for a worker that has:
    two threads joined it at once (shutdown and a monitor that woke at its exit), and the other
    one reaped it."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class _RecordedWaits:
    """While active: the timeouts one thread (the caller's, or the one watch() names) passes to
    a queue's get or to multiprocessing.connection.wait (the slices a call waits in), and those
    any thread passes to a worker's join (what shutdown() gives each worker). `broken` says
    which wait broke the README's rule as soon as it starts: a slice longer than `most` s; a
    third slice begun while `executor.failed` is set (a call that does not look at it); a join
    without a limit of a worker that still runs (checked after scaled(1) s: a killed one has
    ended by then)."""

    def __init__(self, most=None, executor=None, procs=()):
        self.most, self.executor, self.procs = most, executor, list(procs)
        self.thread, self.wake = threading.get_ident(), threading.Event()
        self.gets, self.joins, self.after_failed, self.broken = [], [], 0, ""
        self.in_get = False  # a get's own wait for data is not another slice

    def watch(self, thread, wake) -> None:
        self.thread, self.wake = thread, wake

    def __enter__(self):
        self.real = (mp.queues.Queue.get, mp.connection.wait, mp.process.BaseProcess.join)
        real_get, real_wait, real_join = self.real

        def get(q, block=True, timeout=None):
            mine = threading.get_ident() == self.thread
            self._slice(timeout if block else 0.0)
            self.in_get |= mine
            try:
                return real_get(q, block, timeout)
            finally:
                self.in_get &= not mine

        def wait(objects, timeout=None):
            if not (self.in_get and threading.get_ident() == self.thread):
                self._slice(timeout)
            return real_wait(objects, timeout)

        def join(proc, timeout=None):
            if timeout is not None:
                self.joins.append(timeout)
                return real_join(proc, timeout)
            real_join(proc, scaled(1.0))  # a join without a limit after SIGKILL is right
            if proc.exitcode is None and _dying(proc.pid):  # killed, and slow to go when busy
                real_join(proc, scaled(10.0))
            if proc.exitcode is None and _still_runs(proc.pid):
                who = f"worker {self.procs.index(proc)}" if proc in self.procs else proc.name
                self.joins.append(float("inf"))
                self._break(f"it joins {who} without a limit while that worker still runs "
                            "(hung in a call, deaf to SIGTERM): join each worker for at most "
                            "JOIN_S (1 s), terminate it, join JOIN_S again, then kill it")
            return real_join(proc)
        mp.queues.Queue.get, mp.connection.wait, mp.process.BaseProcess.join = get, wait, join
        return self

    def _slice(self, timeout) -> None:
        if threading.get_ident() != self.thread:
            return
        timeout = float("inf") if timeout is None else timeout
        self.gets.append(timeout)
        if self.most is not None and timeout > self.most:
            self._break(f"it waits {timeout:g} s in one slice: the README has a pending call "
                        f"wait in slices of at most POLL_S ({self.most:g} s) and look at "
                        "`failed` between them, so that a death fails it within a slice")
        if self.executor is not None and self.executor.failed and timeout > 0:
            self.after_failed += 1
            if self.after_failed >= 3:
                self._break(f"`failed` is set ({self.executor.failed!r}), yet the call began "
                            f"{self.after_failed} more waits: between slices, raise the "
                            "RuntimeError when `failed` is set")

    def _break(self, why: str) -> None:
        self.broken = self.broken or why
        self.wake.set()

    def shown(self) -> str:
        return f"its waits: slices {sorted(set(self.gets))} s, joins {sorted(set(self.joins))} s"

    def __exit__(self, *exc) -> None:
        mp.queues.Queue.get, mp.connection.wait, mp.process.BaseProcess.join = self.real


def _outcome(fn):
    try:
        return {"value": fn()}
    except Exception as e:
        return {"error": e}


class Running:
    """An Executor that is shut down whatever the test did."""

    def __init__(self, impl, n):
        self.executor = impl.Executor(n)

    def __enter__(self):
        return self.executor

    def __exit__(self, *exc):
        self.executor.shutdown()


class CountingWorker:
    """Replaces impl.Worker in the forked worker: count() tells how often this Worker ran it."""

    def __init__(self, base, rank):
        self.base, self.n = base(rank), 0

    def __getattr__(self, name):
        return getattr(self.base, name)

    def count(self):
        self.n += 1
        return self.n


@test(input="worker_main(3, ...) in a process: rank, echo, boom on rank 3, count twice, calls for "
            "output_rank 1 and 0 (no reply), then 3, an unknown method, then None", timeout=WAIT_S)
def worker_loop(impl):
    stop_at_once = queue.Queue()
    stop_at_once.put(None)
    step("worker_main(0, a queue holding None, a queue) in the test's process: it returns at None")
    impl.worker_main(0, stop_at_once, queue.Queue())  # returns at None (here, in this process)
    base = impl.Worker
    impl.Worker = lambda rank: CountingWorker(base, rank)  # the forked worker_main makes these
    ctx = mp.get_context("fork")
    requests, replies = ctx.Queue(), ctx.Queue()
    step("worker_main(3, requests, replies) in a forked process, sent the requests below")
    proc = ctx.Process(target=impl.worker_main, args=(3, requests, replies))
    proc.start()
    try:
        def call(request, what):
            requests.put(request)
            deadline = time.monotonic() + WAIT_S
            while time.monotonic() < deadline:
                try:
                    return replies.get(timeout=0.1)
                except queue.Empty:
                    if not proc.is_alive():
                        raise Fail(f"the worker process exited (code {proc.exitcode}) instead of "
                                   f"replying to {request} ({what})") from None
            raise Fail(f"no reply to {request} within {WAIT_S:g} s ({what})")
        check_equal(call((1, "get_rank", (), None), "rank"), (1, 3, "ok", 3),
                    "the reply to (1, 'get_rank', (), None): (call_id, rank, status, result)")
        check_equal(call((2, "echo", ({"a": [1]},), None), "echo"), (2, 3, "ok", {"a": [1]}),
                    "the reply to (2, 'echo', ({'a': [1]},), None)")
        reply = call((3, "boom", (3,), None), "boom")
        if reply[:3] != (3, 3, "error") or "ValueError" not in str(reply[3]):
            raise Fail("a method that raises: reply (call_id, rank, 'error', 'ValueError: ...') "
                       "and keep serving", expected=(3, 3, "error", "ValueError: boom on rank 3"),
                       got=reply)
        check_equal(reply[3], "ValueError: boom on rank 3", "the error text of a method that "
                    "raised (f'{type(e).__name__}: {e}')")
        check_equal([call((c, "count", (), None), "count")[3] for c in (31, 32)], [1, 2],
                    "count() twice: how often the worker's Worker ran it (one Worker for the "
                    "whole loop, not one per call)")
        requests.put((4, "get_rank", (), 1))
        requests.put((40, "get_rank", (), 0))
        got = call((5, "get_rank", (), 3), "output rank 3")  # replies come in request order
        if got[0] != 5:
            raise Fail(f"worker 3 replied to call {got[0]}, whose output_rank is "
                       f"{1 if got[0] == 4 else 0}: only the output rank replies (the others run "
                       "the method and stay silent; output_rank 0 is a rank, not None)", got=got)
        check_equal(got, (5, 3, "ok", 3), "the reply to a call whose output_rank is this "
                                          "worker's")
        reply = call((6, "no_such_method", (), None), "unknown method")
        if reply[:3] != (6, 3, "error") or "AttributeError" not in str(reply[3]):
            raise Fail("an unknown method: reply 'error' with the AttributeError",
                       expected=(6, 3, "error", "AttributeError: ..."), got=reply)
        requests.put(None)
        proc.join(WAIT_S)
        check_equal(proc.exitcode, 0, "worker_main's exit code after None")
    finally:
        impl.Worker = base
        kill_if_alive(proc)


@test(input="Executor(3): get_rank; echo; sleep [0.4, 0.2, 0] (replies out of order); "
            "get_rank with output_rank=1", timeout=40)
def gathers_in_rank_order(impl):
    step("Executor(3)")
    with Running(impl, 3) as e:
        check_equal([getattr(getattr(p, "_popen", None), "method", None) for p in e.procs],
                    ["spawn"] * 3, "how each worker process was started (README: the spawn "
                    "context; a forked worker inherits the parent's threads and, in vLLM, its "
                    "CUDA state)")
        step("collective_rpc('get_rank'), the first call (the workers start)")
        check_equal(_returns(lambda: e.collective_rpc("get_rank"), "collective_rpc('get_rank')",
                             lambda: "every worker answers get_rank once it has started: does "
                                     "the call drop its own replies (the call-id check)?",
                             limit=WAIT_S, impl=impl),
                    [0, 1, 2], "collective_rpc('get_rank')")
        step("collective_rpc('echo', ('x',))")
        check_equal(e.collective_rpc("echo", ("x",)), ["x", "x", "x"],
                    "collective_rpc('echo', ('x',))")
        step("collective_rpc('sleep', ([0.4, 0.2, 0],))")
        check_equal(e.collective_rpc("sleep", ([0.4, 0.2, 0],)), ["slept 0.4", "slept 0.2",
                                                                  "slept 0"],
                    "collective_rpc('sleep', ([0.4, 0.2, 0],)): results in rank order")
        step("collective_rpc('get_rank', output_rank=1)")
        check_equal(_returns(lambda: e.collective_rpc("get_rank", output_rank=1),
                             "collective_rpc('get_rank', output_rank=1)",
                             lambda: "only rank 1 replies: read its queue alone", impl=impl), 1,
                    "collective_rpc('get_rank', output_rank=1): the output rank's result alone")
        step(f"collective_rpc('get_rank', timeout={scaled(3.0):g}, output_rank=0)")
        try:  # only rank 0 replies: a call that waits for every rank times out
            got = e.collective_rpc("get_rank", timeout=scaled(3.0), output_rank=0)
        except TimeoutError as exc:
            got = f"TimeoutError: {exc}"
        check_equal(got, 0, "collective_rpc('get_rank', output_rank=0): rank 0's result alone "
                            "(0 is a rank, not None: only rank 0 replies)")
        step("collective_rpc('get_rank') again")
        check_equal(e.collective_rpc("get_rank"), [0, 1, 2], "collective_rpc('get_rank') again")
        check_equal(e.failed, None, "`failed` while every worker is alive (None, not another "
                                    "false value)")


@test(input="Executor(3): boom on rank 0 while ranks 1 and 2 take 0.5 s to reply; at once "
            "get_rank", timeout=40)
def error_names_the_worker(impl):
    with Running(impl, 3) as e:
        step(f"collective_rpc('get_rank', timeout={WAIT_S:g}): the workers start")
        e.collective_rpc("get_rank", timeout=WAIT_S)
        step(f"collective_rpc('boom', (0, 0.5), timeout={WAIT_S:g})")
        _raises(lambda: e.collective_rpc("boom", (0, 0.5), timeout=WAIT_S), RuntimeError,
                ["worker 0", "ValueError", "boom"], "collective_rpc('boom', (0, 0.5)) (rank 0 "
                "raises at once; ranks 1 and 2 answer 0.5 s later)")
        step(f"collective_rpc('get_rank', timeout={WAIT_S:g}) right after the failed call")
        check_equal(e.collective_rpc("get_rank", timeout=WAIT_S), [0, 1, 2],
                    "collective_rpc('get_rank') right after the failed call (the replies of "
                    "ranks 1 and 2 to that call come while this one waits: they must not "
                    "answer this one; only a call id tells them apart)")


@test(input="Executor(3): sleep [0.5, 1.0, 1.5] with timeout=1.25; then sleep [0.4, 0.4, 0.4] "
            "with timeout=5; get_rank; sleep [0.3]*3 with timeout=0; with POLL_S 60 s, "
            "sleep [0, 0, 0.6] with timeout=0.3", timeout=40)
def one_deadline(impl):
    with Running(impl, 3) as e:
        step(f"collective_rpc('get_rank', timeout={WAIT_S:g}): the workers start")
        e.collective_rpc("get_rank", timeout=WAIT_S)
        what = ("sleep [0.5, 1.0, 1.5] with timeout=1.25 (one deadline for the whole call, not a "
                "fresh timeout per worker)")
        step(f"collective_rpc('sleep', ([0.5, 1.0, 1.5],), timeout=1.25)")
        message = _raises(lambda: e.collective_rpc("sleep", ([0.5, 1.0, 1.5],), timeout=1.25),
                          TimeoutError, [], what)
        if "worker 2" not in message and "worker 1" not in message:  # 1 only on a slow machine
            raise Fail(f"{what}: the TimeoutError must name the worker that did not answer",
                       expected="... worker 2 ...", got=message)
        if "sleep" not in message:
            raise Fail(f"{what}: the TimeoutError must name the method that was not answered",
                       expected="worker 2 did not answer 'sleep' within 1.25 s", got=message)
        step("collective_rpc('sleep', ([0.4, 0.4, 0.4],), timeout=5) right after the timed-out "
             "call")
        check_equal(e.collective_rpc("sleep", ([0.4, 0.4, 0.4],), timeout=5), ["slept 0.4"] * 3,
                    "sleep [0.4, 0.4, 0.4] with timeout=5 right after the timed-out call "
                    "(worker 2's late 'slept 1.5', in its queue before this answer, is a reply "
                    "to the same method: only a call id, fresh for every call, tells it from "
                    "this call's answer)")
        step(f"collective_rpc('get_rank', timeout={WAIT_S:g})")
        check_equal(e.collective_rpc("get_rank", timeout=WAIT_S), [0, 1, 2],
                    "collective_rpc('get_rank') after those calls")
        step("collective_rpc('sleep', ([0.3, 0.3, 0.3],), timeout=0)")
        _raises(lambda: e.collective_rpc("sleep", ([0.3, 0.3, 0.3],), timeout=0), TimeoutError,
                ["worker 0"], "sleep [0.3, 0.3, 0.3] with timeout=0 (a deadline that has passed "
                "already, not 'no timeout')")
        step(f"collective_rpc('get_rank', timeout={WAIT_S:g}) after the call with timeout=0")
        check_equal(e.collective_rpc("get_rank", timeout=WAIT_S), [0, 1, 2],
                    "collective_rpc('get_rank') after the call with timeout=0")
        impl.POLL_S = 3 * WAIT_S  # a slice longer than the call's timeout must end at its deadline
        step(f"collective_rpc('sleep', ([0, 0, 0.6],), timeout=0.3) with POLL_S {impl.POLL_S:g}")
        _raises(lambda: e.collective_rpc("sleep", ([0, 0, 0.6],), timeout=0.3), TimeoutError, [],
                f"sleep [0, 0, 0.6] with timeout=0.3 while POLL_S is {impl.POLL_S:g} s (each wait "
                "gets at most what is left of the deadline, min(POLL_S, left), not a whole slice)")


@test(input="Executor(3): boom on rank 2 with output_rank=2; then sleep [0, 0, 1.0] with "
            "output_rank=2 and timeout=0.3", timeout=40)
def errors_name_the_output_rank(impl):
    with Running(impl, 3) as e:
        step(f"collective_rpc('get_rank', timeout={WAIT_S:g}): the workers start")
        e.collective_rpc("get_rank", timeout=WAIT_S)
        what = "(the error names the worker by its rank, 2, not by its place in the list of " \
               "replies read)"
        step(f"collective_rpc('boom', (2,), timeout={WAIT_S:g}, output_rank=2)")
        _raises(lambda: e.collective_rpc("boom", (2,), timeout=WAIT_S, output_rank=2),
                RuntimeError, ["worker 2"], f"collective_rpc('boom', (2,), output_rank=2) {what}")
        step(f"collective_rpc('boom', (2,), timeout={WAIT_S:g}, output_rank=1)")
        check_equal(e.collective_rpc("boom", (2,), timeout=WAIT_S, output_rank=1),
                    "no boom on rank 1", "collective_rpc('boom', (2,), output_rank=1): rank 1's "
                    "result (rank 2 raised, but only the output rank's reply is read)")
        step("collective_rpc('sleep', ([0, 0, 1.0],), timeout=0.3, output_rank=2)")
        _raises(lambda: e.collective_rpc("sleep", ([0, 0, 1.0],), timeout=0.3, output_rank=2),
                TimeoutError, ["worker 2"], "collective_rpc('sleep', ([0, 0, 1.0],), timeout=0.3, "
                f"output_rank=2) {what}")


@test(input="Executor(3): die(rank=1, exit code 3) while ranks 0 and 2 sleep 0.5 s, no "
            "timeout; then get_rank", timeout=30,
      hang="a call without a timeout waited for a worker that had died: the monitor must set "
           "`failed`, and a waiting call must look at it between short waits.")
def death_fails_pending_call(impl):
    with Running(impl, 3) as e:
        step(f"collective_rpc('get_rank', timeout={WAIT_S:g}): the workers start")
        e.collective_rpc("get_rank", timeout=WAIT_S)
        what = "a call (no timeout) during which worker 1 exits with code 3"
        step("collective_rpc('die', (1, 3, 0.5)): no timeout; its waits are recorded")
        with _RecordedWaits(most=POLL_S, executor=e) as recorded:
            _raises(lambda: _returns(lambda: e.collective_rpc("die", (1, 3, 0.5)), what, lambda: (
                "`failed` is still None: the monitor did not record the death (wait on every "
                "worker's sentinel)" if e.failed is None else f"`failed` is set ({e.failed!r}) "
                "but the waiting call does not look at it between waits of at most POLL_S"),
                recorded=recorded, impl=impl), RuntimeError, ["worker 1", "3"], what)
        step(f"collective_rpc('get_rank', timeout={WAIT_S:g}) after worker 1 died")
        _raises(lambda: e.collective_rpc("get_rank", timeout=WAIT_S), RuntimeError, ["worker 1"],
                "collective_rpc after a worker died (the executor has failed)")
        impl.POLL_S = WAIT_S  # rank 0's answer comes within one slice, however busy the machine
        step(f"collective_rpc('get_rank', timeout={WAIT_S:g}, output_rank=0) with POLL_S "
             f"{impl.POLL_S:g}")
        _raises(lambda: e.collective_rpc("get_rank", timeout=WAIT_S, output_rank=0),
                RuntimeError, ["worker 1"], "collective_rpc('get_rank', output_rank=0) after "
                "worker 1 died (rank 0 is alive and answers, but the executor has failed: every "
                "later call raises, before it sends anything)")


@test(input="Executor(2): get_rank; then die(rank=1, SIGKILL) while rank 0 sleeps 0.5 s, "
            "with timeout=8", timeout=30)
def death_fails_a_call_before_its_deadline(impl):
    timeout = 8.0
    with Running(impl, 2) as e:
        step(f"collective_rpc('get_rank', timeout={WAIT_S:g}): the workers start")
        e.collective_rpc("get_rank", timeout=WAIT_S)
        what = f"a call with timeout={timeout:g} during which worker 1 was killed at once"
        step(f"collective_rpc('die', (1, -9, 0.5), timeout={timeout:g}): its waits are recorded")
        with _RecordedWaits(most=POLL_S, executor=e) as recorded:
            try:
                _returns(lambda: e.collective_rpc("die", (1, -signal.SIGKILL, 0.5),
                                                  timeout=timeout), what,
                         lambda: "`failed` is still None: the monitor did not record the death"
                         if e.failed is None else f"`failed` is set ({e.failed!r}), but the call "
                         "does not look at it between slices", recorded=recorded,
                         limit=timeout, impl=impl)
            except Fail:
                raise
            except Exception as exc:
                got = f"{type(exc).__name__}: {exc}"
            else:
                raise Fail(f"{what} returned")
        if not got.startswith("RuntimeError") or "worker 1" not in got or "-9" not in got:
            raise Fail("a call during which worker 1 was killed with SIGKILL must raise the "
                       "RuntimeError naming it and its exit code",
                       expected="RuntimeError: ... worker 1 ... -9 ...", got=got)


@test(input="Executor(2): die(rank=1, exit code 0) with output_rank=0 (rank 0 answers at once); "
            "then get_rank", timeout=30)
def output_rank_runs_on_every_worker(impl):
    with Running(impl, 2) as e:
        step(f"collective_rpc('get_rank', timeout={WAIT_S:g}): the workers start")
        e.collective_rpc("get_rank", timeout=WAIT_S)
        step(f"collective_rpc('die', (1, 0, 0.0), timeout={WAIT_S:g}, output_rank=0)")
        try:  # rank 0's answer or worker 1's death may come first: either is right here
            e.collective_rpc("die", (1, 0, 0.0), timeout=WAIT_S, output_rank=0)
        except RuntimeError:
            pass
        step(f"collective_rpc('get_rank', timeout={HANG_S:g}) after worker 1 exited")
        _raises(lambda: e.collective_rpc("get_rank", timeout=HANG_S), RuntimeError,
                ["worker 1", "exit code 0"], "collective_rpc('get_rank') after die(rank=1, exit "
                "code 0) with output_rank=0 (the request still goes to every worker: rank 1 ran "
                "die and exited; an exit before shutdown() is a death, with code 0 too)")


@test(input="Executor(3): get_rank; stall on rank 2 (it ignores SIGTERM, sleeps 3600 s) with "
            "timeout=0.5; shutdown(); shutdown() again; then get_rank", timeout=40)
def shutdown_is_clean(impl):
    before = set(threading.enumerate())
    step("Executor(3)")
    e = impl.Executor(3)
    try:
        step(f"collective_rpc('get_rank', timeout={WAIT_S:g}): the workers start")
        e.collective_rpc("get_rank", timeout=WAIT_S)
        step("collective_rpc('stall', (2, 3600.0), timeout=0.5)")
        _raises(lambda: e.collective_rpc("stall", (2, 3600.0), timeout=0.5), TimeoutError,
                ["worker 2"], "stall on rank 2 with timeout=0.5")
        step("shutdown(), worker 2 hung in stall and deaf to SIGTERM; its joins are recorded")
        with _RecordedWaits(procs=e.procs) as recorded:
            _returns(e.shutdown, "shutdown() (worker 2 hung in a call, deaf to SIGTERM)",
                     lambda: "join each worker for at most JOIN_S, terminate it, and kill it if "
                     "it still runs (the monitor, woken through its pipe, must end too)",
                     recorded=recorded, limit=HANG_S + 3 * JOIN_S, impl=impl)
        longest = max(recorded.joins, default=0.0)
        if longest > JOIN_S:
            raise Fail(f"shutdown() joined a worker for {longest:g} s: the README has it join "
                       f"each for at most JOIN_S ({JOIN_S:g} s), then terminate, then kill",
                       got=f"join timeouts {sorted(set(recorded.joins))} s")
    finally:
        kill_if_alive(*e.procs)
    step("shutdown() again")
    e.shutdown()
    codes = [p.exitcode for p in e.procs]
    check_equal(codes, [0, 0, -9], "the workers' exit codes after shutdown() (0 and 1 told to "
                                   "stop with None, exit 0; 2, hung and deaf to SIGTERM, killed)")
    if e.failed:
        raise Fail("shutdown() was taken for a worker death: the monitor must stop first",
                   got=e.failed)
    left = [t.name for t in set(threading.enumerate()) - before
            if t.is_alive() and t.name != "QueueFeederThread"]
    if left:
        raise Fail("threads still running after shutdown() (the monitor must be woken and "
                   "joined)", got=left)
    step("collective_rpc('get_rank', timeout=5) after shutdown()")
    _raises(lambda: e.collective_rpc("get_rank", timeout=5), RuntimeError, [],
            "collective_rpc after shutdown()")


ENDS_WITHOUT_SHUTDOWN = """
import threading, {module} as m
e = m.Executor(2)
print(*(p.pid for p in e.procs), flush=True)
print(e.collective_rpc("get_rank", timeout={wait}), flush=True)
print("non-daemon workers:", [r for r, p in enumerate(e.procs) if not p.daemon],
      "non-daemon threads:", [t.name for t in threading.enumerate()
                              if not (t.daemon or t is threading.main_thread())], flush=True)
"""  # and the program ends, without shutdown()


@test(input="a program: Executor(2), get_rank, and its end without shutdown()", timeout=40)
def exit_without_shutdown(impl):
    code = ENDS_WITHOUT_SHUTDOWN.format(module=impl.__name__, wait=WAIT_S)
    with tempfile.TemporaryDirectory() as d:  # files, not pipes: the workers inherit stdout
        out, err = Path(d, "out"), Path(d, "err")
        with out.open("w") as o, err.open("w") as r:
            proc = subprocess.Popen([sys.executable, "-c", code], stdout=o, stderr=r)
        lines, deadline = [], time.monotonic() + WAIT_S
        while proc.poll() is None and len(lines) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
            lines = out.read_text().split("\n")[:-1]  # whole lines only
        daemons = len(lines) == 3 and lines[2].endswith("workers: [] non-daemon threads: []")
        try:  # a program with non-daemon workers or threads hangs at exit: no need to wait
            proc.wait(HANG_S if daemons else 0)  # exiting takes well under 1 s
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            for pid in lines[0].split() if lines else []:  # the workers, orphaned and waiting
                kill_pid(int(pid))
            if len(lines) < 3:
                raise Fail(f"a program that made an Executor(2) and called get_rank printed "
                           f"only {lines} in {WAIT_S:g} s", got=err.read_text()[-800:]) from None
            raise Fail(f"a program that made an Executor and ended without shutdown() would "
                       f"not exit ({lines[-1]}): at exit Python joins non-daemon threads, then "
                       "non-daemon child processes, and neither ends by itself. The workers "
                       "must be daemon processes and the monitor a daemon thread (vLLM: "
                       "multiproc_executor.py:394, :849)") from None
        lines, errors = out.read_text().splitlines(), err.read_text()
    if proc.returncode != 0 or lines[1:2] != ["[0, 1]"]:
        raise Fail("a program that made an Executor(2), called get_rank and ended without "
                   f"shutdown() exited with code {proc.returncode}",
                   expected="exit code 0 after printing [0, 1]", got=(lines, errors[-800:]))


def kill_pid(pid):
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
