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
from pathlib import Path

from minivllm.judge.api import Fail, check_equal, kill_if_alive, scaled, test

WAIT_S = scaled(20.0)  # a reply or a process start that takes this long is lost
HANG_S = scaled(10.0)  # a call that should end at once (or within POLL_S) hangs


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


def _returns(fn, what, why):
    """fn() in a thread; Fail naming `what` and why(), not a bare time-out, if it hangs."""
    out = {}
    thread = threading.Thread(target=lambda: out.update(_outcome(fn)), daemon=True)
    thread.start()
    thread.join(HANG_S)
    if thread.is_alive():
        raise Fail(f"{what} was still waiting {HANG_S:g} s later: {why()}")
    if "error" in out:
        raise out["error"]
    return out["value"]


class _RecordedWaits:
    """While active, the timeouts this thread (the caller's) passes to a queue's get or to
    multiprocessing.connection.wait, and those any thread passes to a worker's join: the
    slices a call waits in, and what shutdown() gives each worker."""

    def __enter__(self):
        self.thread, self.gets, self.joins = threading.get_ident(), [], []
        self.real = (mp.queues.Queue.get, mp.connection.wait, mp.process.BaseProcess.join)
        real_get, real_wait, real_join = self.real

        def get(q, block=True, timeout=None):
            self._slice(timeout if block else 0.0)
            return real_get(q, block, timeout)

        def wait(objects, timeout=None):
            self._slice(timeout)
            return real_wait(objects, timeout)

        def join(proc, timeout=None):
            if timeout is not None:  # one without a limit after SIGKILL is right
                self.joins.append(timeout)
            return real_join(proc, timeout)
        mp.queues.Queue.get, mp.connection.wait, mp.process.BaseProcess.join = get, wait, join
        return self

    def _slice(self, timeout) -> None:
        if threading.get_ident() == self.thread:
            self.gets.append(float("inf") if timeout is None else timeout)

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
    impl.worker_main(0, stop_at_once, queue.Queue())  # returns at None (here, in this process)
    base = impl.Worker
    impl.Worker = lambda rank: CountingWorker(base, rank)  # the forked worker_main makes these
    ctx = mp.get_context("fork")
    requests, replies = ctx.Queue(), ctx.Queue()
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
    with Running(impl, 3) as e:
        check_equal([getattr(getattr(p, "_popen", None), "method", None) for p in e.procs],
                    ["spawn"] * 3, "how each worker process was started (README: the spawn "
                    "context; a forked worker inherits the parent's threads and, in vLLM, its "
                    "CUDA state)")
        check_equal(_returns(lambda: e.collective_rpc("get_rank"), "collective_rpc('get_rank')",
                             lambda: "every worker answers get_rank at once: does the call drop "
                                     "its own replies (the call-id check)?"),
                    [0, 1, 2], "collective_rpc('get_rank')")
        check_equal(e.collective_rpc("echo", ("x",)), ["x", "x", "x"],
                    "collective_rpc('echo', ('x',))")
        check_equal(e.collective_rpc("sleep", ([0.4, 0.2, 0],)), ["slept 0.4", "slept 0.2",
                                                                  "slept 0"],
                    "collective_rpc('sleep', ([0.4, 0.2, 0],)): results in rank order")
        check_equal(_returns(lambda: e.collective_rpc("get_rank", output_rank=1),
                             "collective_rpc('get_rank', output_rank=1)",
                             lambda: "only rank 1 replies: read its queue alone"), 1,
                    "collective_rpc('get_rank', output_rank=1): the output rank's result alone")
        try:  # only rank 0 replies: a call that waits for every rank times out
            got = e.collective_rpc("get_rank", timeout=scaled(3.0), output_rank=0)
        except TimeoutError as exc:
            got = f"TimeoutError: {exc}"
        check_equal(got, 0, "collective_rpc('get_rank', output_rank=0): rank 0's result alone "
                            "(0 is a rank, not None: only rank 0 replies)")
        check_equal(e.collective_rpc("get_rank"), [0, 1, 2], "collective_rpc('get_rank') again")
        check_equal(e.failed, None, "`failed` while every worker is alive (None, not another "
                                    "false value)")


@test(input="Executor(3): boom on rank 0 while ranks 1 and 2 take 1 s to reply; at once "
            "get_rank", timeout=40)
def error_names_the_worker(impl):
    with Running(impl, 3) as e:
        e.collective_rpc("get_rank", timeout=WAIT_S)  # the workers are up
        _raises(lambda: e.collective_rpc("boom", (0, 1.0), timeout=WAIT_S), RuntimeError,
                ["worker 0", "ValueError", "boom"], "collective_rpc('boom', (0, 1.0)) (rank 0 "
                "raises at once; ranks 1 and 2 answer 1 s later)")
        check_equal(e.collective_rpc("get_rank", timeout=WAIT_S), [0, 1, 2],
                    "collective_rpc('get_rank') right after the failed call (the replies of "
                    "ranks 1 and 2 to that call come while this one waits: they must not "
                    "answer this one; only a call id tells them apart)")


@test(input="Executor(3): sleep [1.0, 2.0, 3.0] with timeout=2.5; then sleep [0.4, 0.4, 0.4] "
            "with timeout=5; get_rank; sleep [0.3]*3 with timeout=0; with POLL_S 60 s, "
            "sleep [0, 0, 0.6] with timeout=0.3", timeout=40)
def one_deadline(impl):
    with Running(impl, 3) as e:
        e.collective_rpc("get_rank", timeout=WAIT_S)  # the workers are up
        what = ("sleep [1.0, 2.0, 3.0] with timeout=2.5 (one deadline for the whole call, not a "
                "fresh timeout per worker)")
        message = _raises(lambda: e.collective_rpc("sleep", ([1.0, 2.0, 3.0],), timeout=2.5),
                          TimeoutError, [], what)
        if "worker 2" not in message and "worker 1" not in message:  # 1 only on a slow machine
            raise Fail(f"{what}: the TimeoutError must name the worker that did not answer",
                       expected="... worker 2 ...", got=message)
        if "sleep" not in message:
            raise Fail(f"{what}: the TimeoutError must name the method that was not answered",
                       expected="worker 2 did not answer 'sleep' within 2.5 s", got=message)
        check_equal(e.collective_rpc("sleep", ([0.4, 0.4, 0.4],), timeout=5), ["slept 0.4"] * 3,
                    "sleep [0.4, 0.4, 0.4] with timeout=5 right after the timed-out call "
                    "(worker 2's late 'slept 3.0', in its queue before this answer, is a reply "
                    "to the same method: only a call id, fresh for every call, tells it from "
                    "this call's answer)")
        check_equal(e.collective_rpc("get_rank", timeout=WAIT_S), [0, 1, 2],
                    "collective_rpc('get_rank') after those calls")
        _raises(lambda: e.collective_rpc("sleep", ([0.3, 0.3, 0.3],), timeout=0), TimeoutError,
                ["worker 0"], "sleep [0.3, 0.3, 0.3] with timeout=0 (a deadline that has passed "
                "already, not 'no timeout')")
        check_equal(e.collective_rpc("get_rank", timeout=WAIT_S), [0, 1, 2],
                    "collective_rpc('get_rank') after the call with timeout=0")
        impl.POLL_S = 3 * WAIT_S  # a slice longer than the call's timeout must end at its deadline
        _raises(lambda: e.collective_rpc("sleep", ([0, 0, 0.6],), timeout=0.3), TimeoutError, [],
                f"sleep [0, 0, 0.6] with timeout=0.3 while POLL_S is {impl.POLL_S:g} s (each wait "
                "gets at most what is left of the deadline, min(POLL_S, left), not a whole slice)")


@test(input="Executor(3): boom on rank 2 with output_rank=2; then sleep [0, 0, 1.0] with "
            "output_rank=2 and timeout=0.3", timeout=40)
def errors_name_the_output_rank(impl):
    with Running(impl, 3) as e:
        e.collective_rpc("get_rank", timeout=WAIT_S)  # the workers are up
        what = "(the error names the worker by its rank, 2, not by its place in the list of " \
               "replies read)"
        _raises(lambda: e.collective_rpc("boom", (2,), timeout=WAIT_S, output_rank=2),
                RuntimeError, ["worker 2"], f"collective_rpc('boom', (2,), output_rank=2) {what}")
        check_equal(e.collective_rpc("boom", (2,), timeout=WAIT_S, output_rank=1),
                    "no boom on rank 1", "collective_rpc('boom', (2,), output_rank=1): rank 1's "
                    "result (rank 2 raised, but only the output rank's reply is read)")
        _raises(lambda: e.collective_rpc("sleep", ([0, 0, 1.0],), timeout=0.3, output_rank=2),
                TimeoutError, ["worker 2"], "collective_rpc('sleep', ([0, 0, 1.0],), timeout=0.3, "
                f"output_rank=2) {what}")


@test(input="Executor(3): die(rank=1, exit code 3) while ranks 0 and 2 sleep 1 s, no timeout; "
            "then get_rank", timeout=30,
      hang="a call without a timeout waited for a worker that had died: the monitor must set "
           "`failed`, and a waiting call must look at it between short waits.")
def death_fails_pending_call(impl):
    with Running(impl, 3) as e:
        e.collective_rpc("get_rank", timeout=WAIT_S)
        what = "a call (no timeout) during which worker 1 exits with code 3"
        _raises(lambda: _returns(lambda: e.collective_rpc("die", (1, 3, 1.0)), what, lambda: (
            "`failed` is still None: the monitor did not record the death (wait on every "
            "worker's sentinel)" if e.failed is None else f"`failed` is set ({e.failed!r}) but "
            "the waiting call does not look at it between waits of at most POLL_S")),
                RuntimeError, ["worker 1", "3"], what)
        _raises(lambda: e.collective_rpc("get_rank", timeout=WAIT_S), RuntimeError, ["worker 1"],
                "collective_rpc after a worker died (the executor has failed)")
        impl.POLL_S = WAIT_S  # rank 0's answer comes within one slice, however busy the machine
        _raises(lambda: e.collective_rpc("get_rank", timeout=WAIT_S, output_rank=0),
                RuntimeError, ["worker 1"], "collective_rpc('get_rank', output_rank=0) after "
                "worker 1 died (rank 0 is alive and answers, but the executor has failed: every "
                "later call raises, before it sends anything)")


@test(input="Executor(2): get_rank; then die(rank=1, SIGKILL) while rank 0 sleeps 1 s, with "
            "timeout=8", timeout=30)
def death_fails_a_call_before_its_deadline(impl):
    timeout = 8.0
    with Running(impl, 2) as e:
        e.collective_rpc("get_rank", timeout=WAIT_S)
        start = time.monotonic()
        try:
            with _RecordedWaits() as recorded:
                e.collective_rpc("die", (1, -signal.SIGKILL, 1.0), timeout=timeout)
        except Exception as exc:
            took, got = time.monotonic() - start, f"{type(exc).__name__}: {exc}"
        else:
            raise Fail(f"a call with timeout={timeout:g} during which worker 1 was killed "
                       "returned")
        longest = max(recorded.gets, default=0.0)
        if longest > 0.1:
            raise Fail(f"a call with timeout={timeout:g} waited {longest:g} s in one slice: the "
                       "README has a pending call wait in slices of at most POLL_S (0.1 s) and "
                       "look at `failed` between them, so a death fails it within 0.1 s",
                       got=f"the call's waits: {sorted(set(recorded.gets))} s")
        if took >= timeout:  # a death seen between slices fails the call within ~POLL_S
            raise Fail(f"a call with timeout={timeout:g} during which worker 1 was killed at "
                       f"once failed only after {took:.1f} s, at its own deadline: look at "
                       "`failed` between slices of at most POLL_S, with a timeout too", got=got)
        if not got.startswith("RuntimeError") or "worker 1" not in got or "-9" not in got:
            raise Fail("a call during which worker 1 was killed with SIGKILL must raise the "
                       "RuntimeError naming it and its exit code",
                       expected="RuntimeError: ... worker 1 ... -9 ...", got=got)


@test(input="Executor(2): die(rank=1, exit code 0) with output_rank=0 (rank 0 answers at once); "
            "then get_rank", timeout=30)
def output_rank_runs_on_every_worker(impl):
    with Running(impl, 2) as e:
        e.collective_rpc("get_rank", timeout=WAIT_S)
        try:  # rank 0's answer or worker 1's death may come first: either is right here
            e.collective_rpc("die", (1, 0, 0.0), timeout=WAIT_S, output_rank=0)
        except RuntimeError:
            pass
        _raises(lambda: e.collective_rpc("get_rank", timeout=WAIT_S), RuntimeError,
                ["worker 1", "exit code 0"], "collective_rpc('get_rank') after die(rank=1, exit "
                "code 0) with output_rank=0 (the request still goes to every worker: rank 1 ran "
                "die and exited; an exit before shutdown() is a death, with code 0 too)")


@test(input="Executor(3): get_rank; stall on rank 2 (it ignores SIGTERM, sleeps 3600 s) with "
            "timeout=0.5; shutdown(); shutdown() again; then get_rank", timeout=40)
def shutdown_is_clean(impl):
    before = set(threading.enumerate())
    e = impl.Executor(3)
    done = threading.Event()
    try:
        e.collective_rpc("get_rank", timeout=WAIT_S)
        _raises(lambda: e.collective_rpc("stall", (2, 3600.0), timeout=0.5), TimeoutError,
                ["worker 2"], "stall on rank 2 with timeout=0.5")
        with _RecordedWaits() as recorded:
            threading.Thread(target=lambda: (e.shutdown(), done.set()), daemon=True).start()
            if not done.wait(scaled(15.0)):
                raise Fail("shutdown() did not return while worker 2 was hung in a call and "
                           "ignored SIGTERM: join each worker for a few seconds, terminate it, "
                           "and kill it if it still runs (a join without a limit waits for ever)")
        longest = max(recorded.joins, default=0.0)
        if longest > 1.0:
            raise Fail(f"shutdown() joined a worker for {longest:g} s: the README has it join "
                       "each for at most JOIN_S (1 s), then terminate, then kill",
                       got=f"join timeouts {sorted(set(recorded.joins))} s")
    finally:
        kill_if_alive(*e.procs)
    e.shutdown()
    codes = [p.exitcode for p in e.procs]
    check_equal(codes, [0, 0, -9], "the workers' exit codes after shutdown() (0 and 1 told to "
                                   "stop; 2, hung and deaf to SIGTERM, killed)")
    if e.failed:
        raise Fail("shutdown() was taken for a worker death: the monitor must stop first",
                   got=e.failed)
    left = [t.name for t in set(threading.enumerate()) - before
            if t.is_alive() and t.name != "QueueFeederThread"]
    if left:
        raise Fail("threads still running after shutdown() (the monitor must be woken and "
                   "joined)", got=left)
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
            lines = out.read_text().splitlines()
        try:
            proc.wait(HANG_S if len(lines) == 3 else 0)  # exiting takes well under 1 s
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            for pid in lines[0].split() if lines else []:  # the workers, orphaned and waiting
                kill_pid(int(pid))
            if len(lines) < 3:
                raise Fail(f"a program that made an Executor(2) and called get_rank printed "
                           f"only {lines} in {WAIT_S:g} s", got=err.read_text()[-800:]) from None
            raise Fail(f"a program that made an Executor and ended without shutdown() did not "
                       f"exit ({lines[-1]}): at exit Python joins non-daemon threads, then "
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
