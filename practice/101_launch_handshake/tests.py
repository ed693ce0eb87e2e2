"""The judge's tests for exercise 101. Each receives the learner's module as `impl`.

Targets the tests need beyond the given four are `exec` with code and a fresh globals dict: a
builtin that a spawn child can unpickle by name, so no test file has to be importable there."""

import inspect
import multiprocessing
import multiprocessing.connection
import os
import re
import signal
import sys
import tempfile
import threading
import time

from minivllm.judge import procfs
from minivllm.judge.api import Fail, check_equal, scaled, step, test

# A child that ignores SIGTERM and writes its pid to a file, then sleeps: a hung worker.
STUBBORN = ("import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "open({path!r}, 'w').write(str(os.getpid())); time.sleep(600)")
# A child that cleans up for `pause` s on SIGTERM, then writes a marker and exits: a good worker.
# Once its handler is set, it writes its pid to path + '.up'.
GRACEFUL = ("import os, signal, sys, time\n"
            "def bye(*_):\n time.sleep({pause}); open({path!r}, 'w').write('cleaned up'); "
            "sys.exit(0)\n"
            "signal.signal(signal.SIGTERM, bye); open({path!r} + '.up', 'w').write(str(os.getpid()))"
            "; time.sleep(600)")
# A target that raises after starting a thread that never ends: the child cannot exit by itself.
RAISES_AND_HANGS = ("import threading, time; "
                    "threading.Thread(target=time.sleep, args=(600,)).start(); "
                    "raise ValueError('bad config: tensor_parallel_size=3')")
# A target that returns only once the judge writes `path`: it cannot be ready before then.
GATED = "import os, time\nwhile not os.path.exists({path!r}): time.sleep(0.01)"
STOP_TIMEOUT_S = 0.5  # stop_worker's join limit in the tests: short, the child ignores SIGTERM


def _no_children(what):
    left = multiprocessing.active_children()
    if left:
        for p in left:
            p.kill()
            p.join()
        raise Fail(f"{what}: a worker process was left running; stop it before raising",
                   got=[p.pid for p in left])


_KILLED: set[int] = set()  # the pids this process sent SIGKILL (os.kill is recorded)
_real_kill = os.kill


def _recording_kill(pid: int, sig: int) -> None:
    if sig == signal.SIGKILL:
        _KILLED.add(pid)
    _real_kill(pid, sig)


def _reaped(pid: int, what: str) -> None:
    """Fail if the child `pid` has exited and stop_worker did not reap it; one that was never
    sent SIGKILL (it ignores SIGTERM, so it is still running) is left to _no_children at once."""
    if pid not in _KILLED and procfs.process_state(pid) not in ("Z", "X"):
        return
    deadline = time.monotonic() + scaled(10)
    while not procfs.reaped(pid) and procfs.process_state(pid) != "Z":
        if time.monotonic() > deadline:
            return
        time.sleep(0.02)
    if not procfs.reaped(pid):
        raise Fail(f"{what}: stop_worker returned before the child it killed was reaped: "
                   f"join() it after kill()")


def _wait_for_file(path: str, what: str) -> str:
    deadline = time.monotonic() + scaled(20)
    while not os.path.exists(path) or not open(path).read().strip():
        if time.monotonic() > deadline:
            raise Fail(f"{what} never started")
        time.sleep(0.02)
    return open(path).read().strip()


class _WaitLog:
    """Replaces multiprocessing.connection.wait wherever the learner's module reaches it: records
    the timeout of each call outside Process.join that returned nothing, and the pids of this
    process's children. Two forced schedules: with `armed` (a path), a wait starts only once the
    child has written that file (so it ignores SIGTERM by then, however slowly it started); with
    after_exit=True, a call returns only once every process sentinel among its objects has
    fired (the parent wakes after the child sent its message and exited)."""

    def __init__(self, impl, after_exit: bool = False, armed: str = ""):
        self.impl, self.after_exit, self.armed = impl, after_exit, armed
        self.timeouts, self.pids = [], set()
        self.asked = []  # the timeout of every call outside Process.join, as it was made
        self.waiting = threading.Event()  # set when a call outside Process.join begins
        self.real = multiprocessing.connection.wait
        self.names = [k for k, v in vars(impl).items() if v is self.real]
        self.stop = threading.Event()

    def wait(self, object_list, timeout=None):
        joining = sys._getframe(1).f_globals.get("__name__", "").startswith("multiprocessing.popen")
        if self.armed and not joining:
            _wait_for_file(self.armed, "the worker")
        if self.armed and not joining and timeout is None:
            raise Fail("start_worker called connection.wait(..., timeout=None) for a child that "
                       "never reports: that waits forever; pass the time left of `timeout`")
        if not joining:
            self.asked.append(timeout)
            self.waiting.set()
        sentinels = [o for o in object_list if isinstance(o, int)]
        if self.after_exit and sentinels:
            exited = self.real(sentinels, scaled(20))
            for p in list(multiprocessing.process._children):  # a zombie: all its fds closed
                if p.sentinel in exited:
                    os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOWAIT)
        ready = self.real(object_list, timeout)
        if not ready and not joining:  # Process.join waits on the sentinel too: not a start
            self.timeouts.append(timeout)
        return ready

    def watch(self):
        import psutil
        me = psutil.Process()
        while not self.stop.wait(0.01):
            self.pids.update(c.pid for c in me.children())

    def __enter__(self):
        os.kill = _recording_kill
        multiprocessing.connection.wait = self.wait
        for k in self.names:
            setattr(self.impl, k, self.wait)
        threading.Thread(target=self.watch, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        multiprocessing.connection.wait = self.real
        for k in self.names:
            setattr(self.impl, k, self.real)


@test(input="start_worker(setup_ok, (21,)); the defaults of start_worker and stop_worker",
      timeout=15)
def ready_handshake(impl):
    step("the signatures of start_worker and stop_worker (their timeout defaults)")
    for fn, default in ((impl.start_worker, 10.0), (impl.stop_worker, 2.0)):
        check_equal(inspect.signature(fn).parameters["timeout"].default, default,
                    f"the default timeout of {fn.__name__} (the README fixes the signature)")
    step("start_worker(setup_ok, (21,), timeout=10)")
    proc, result = impl.start_worker(impl.setup_ok, (21,), timeout=10)
    try:
        check_equal(result, 42, "the ready result (setup_ok(21))")
        check_equal(type(proc).__name__, "SpawnProcess",
                    "the kind of process (spawn: fork is unsafe once threads or CUDA exist)")
        if proc.pid == os.getpid():
            raise Fail("the target ran in the judge's process, not in a child")
    finally:
        impl.stop_worker(proc)
    step("stop_worker(the process start_worker(setup_ok, (21,)) returned)")
    if proc.is_alive():
        raise Fail("stop_worker returned while the process is alive")
    step("worker_entry(conn, setup_ok, (21,)) in the judge's process")
    check_equal(_entry_sends(impl, impl.setup_ok, (21,)), ("ready", 42),
                "what worker_entry(conn, setup_ok, (21,)) sends (the README fixes the message: "
                "another side may read it)")
    step("worker_entry(conn, a target that raises ValueError('bad config')) in the judge's "
         "process")
    try:
        got = _entry_sends(impl, exec, ("raise ValueError('bad config')", {}))
    except ValueError:
        raise Fail("worker_entry let its target's ValueError escape: catch any exception and "
                   "send ('error', text)")
    if not (isinstance(got, tuple) and len(got) == 2 and got[0] == "error"):
        raise Fail("what worker_entry sends when its target raises ValueError('bad config')",
                   expected="('error', text)", got=got)


def _entry_sends(impl, target, args):
    """What worker_entry(conn, target, args), run in this process, sends: each call gets a pipe
    of its own, as in a child (conn is the worker's end: it may close it once it has sent)."""
    reader, writer = multiprocessing.Pipe(duplex=False)
    try:
        impl.worker_entry(writer, target, args)
        writer.close()  # closed already if worker_entry closed it: then this does nothing
        if not reader.poll(scaled(10)):
            raise Fail("worker_entry returned without sending anything on conn")
        try:
            return reader.recv()
        except EOFError:
            raise Fail("worker_entry returned without sending anything on conn") from None
    finally:
        reader.close()
        writer.close()


def _expect_start_error(impl, target, args, timeout: float, text: str, what: str,
                        call: str = "") -> None:
    """start_worker(target, args) must raise WorkerStartError whose message holds `text`;
    target is the name of one of impl's, or a builtin; `call` says the call on the input line."""
    name = target if isinstance(target, str) else f"{target.__name__}{args!r}"
    step(call or f"start_worker({name}, timeout={timeout:g})")
    try:
        impl.start_worker(getattr(impl, name, target), args, timeout=timeout)
    except impl.WorkerStartError as e:
        if text not in str(e):
            raise Fail(what, expected=f"...{text}...", got=str(e))
    else:
        raise Fail(f"start_worker({name}) must raise WorkerStartError")


@test(input="start_worker(setup_fails), then a target that raises ValueError, then one that "
            "raises and leaves a thread running (its child cannot exit by itself)", timeout=30)
def error_reaches_the_parent(impl):
    _expect_start_error(impl, "setup_fails", (), 10, "boom: no model file at /models/missing.gguf",
                        "WorkerStartError must carry the child's whole error text")
    _expect_start_error(impl, exec, ("raise ValueError('bad config: tp=3')", {}), 10,
                        "bad config: tp=3", "any exception of the target, not only RuntimeError, "
                        "must reach the parent as ('error', text)",
                        call="start_worker(a target that raises ValueError('bad config: tp=3'), "
                             "timeout=10)")
    _no_children("after a failed start")
    _expect_start_error(impl, exec, (RAISES_AND_HANGS, {}), 10, "tensor_parallel_size=3",
                        "WorkerStartError must carry the child's error text",
                        call="start_worker(a target that raises and leaves a thread running, "
                             "timeout=10)")
    _no_children("after ('error', ...) from a child whose thread keeps it alive")


# A target whose exception holds a lock (a file handle, a socket would do the same): the
# exception object cannot be pickled, its text can.
UNPICKLABLE = ("import threading\n"
               "e = OSError('weights locked: /models/llama.bin')\n"
               "e.lock = threading.Lock()\n"
               "raise e")


@test(input="worker_entry and start_worker with a target that raises OSError('weights locked: "
            "/models/llama.bin') carrying a threading.Lock (the exception cannot be pickled)",
      timeout=20)
def error_is_sent_as_text(impl):
    step("worker_entry(conn, a target raising OSError('weights locked: ...') that holds a lock) "
         "in the judge's process")
    try:
        got = _entry_sends(impl, exec, (UNPICKLABLE, {}))
    except Fail:
        raise
    except Exception as e:  # noqa: BLE001 - the test says what it was
        raise Fail("worker_entry could not send the error of a target whose exception holds a "
                   "lock: send ('error', text) with the exception's text (a str), never the "
                   "exception object: many cannot be pickled", got=f"{type(e).__name__}: {e}")
    if not (isinstance(got, tuple) and len(got) == 2 and isinstance(got[1], str)
            and "weights locked" in got[1]):
        raise Fail("what worker_entry sends when its target raises OSError('weights locked: "
                   "...'): the exception's text, as a str", expected="('error', '...weights "
                   "locked: /models/llama.bin...')", got=repr(got))
    _expect_start_error(impl, exec, (UNPICKLABLE, {}), 10, "weights locked: /models/llama.bin",
                        "WorkerStartError must carry the text of an exception that cannot be "
                        "pickled: the child sends its text, never the exception object",
                        call="start_worker(a target raising OSError('weights locked: ...') that "
                             "holds a lock, timeout=10)")
    _no_children("after a failed start")


@test(input="start_worker(setup_dies) with timeout=30", timeout=12,
      hang="the child died at once, but start_worker kept waiting: also wait on process.sentinel")
def child_dies_before_ready(impl):
    _expect_start_error(impl, "setup_dies", (), 30, "exit code 3", "the error must give the "
                        "child's exit code")
    with _WaitLog(impl, after_exit=True):  # the pipe's end of file and the sentinel both ready
        _expect_start_error(impl, "setup_dies", (), 30, "exit code 3", "a child that died sent "
                            "nothing: the pipe reads end of file (EOFError), and the error must "
                            "give the child's exit code", call="start_worker(setup_dies, "
                            "timeout=30), the parent waking only after the child has exited")
    _no_children("after the child died")


@test(input="start_worker(setup_ok, (21,)) and start_worker(setup_fails), the parent waking only "
            "after the child has sent its message and exited", timeout=20)
def message_wins_over_exit(impl):
    with _WaitLog(impl, after_exit=True):
        step("start_worker(setup_ok, (21,)), the parent waking only after the child has sent "
             "('ready', 42) and exited")
        try:
            proc, result = impl.start_worker(impl.setup_ok, (21,), timeout=scaled(30))
        except impl.WorkerStartError as e:
            raise Fail("the child sent ('ready', 42) and then exited normally; when the pipe and "
                       "the sentinel are both ready, read the message first: it says why the "
                       "child exited", got=str(e))
        impl.stop_worker(proc)
        check_equal(result, 42, "the ready result, read after the child exited")
        step("start_worker(setup_fails), the parent waking only after the child has sent "
             "('error', ...) and exited")
        try:
            impl.start_worker(impl.setup_fails, (), timeout=scaled(30))
        except impl.WorkerStartError as e:
            if "boom" not in str(e):
                raise Fail("the child sent ('error', ...) and then exited; the message, not the "
                           "exit code, must reach the caller", expected="...boom...", got=str(e))
        else:
            raise Fail("start_worker(setup_fails) must raise WorkerStartError")
    _no_children("after a start whose child had exited")


@test(input="start_worker(a child that ignores SIGTERM and never reports, timeout=1)", timeout=40,
      hang="start_worker waited for the message with no time limit, or stop_worker joined a child "
           "that ignores SIGTERM without a limit")
def timeout_stops_the_child(impl):
    asked, armed = 1.0, os.path.join(tempfile.mkdtemp(), "pid")
    started = time.monotonic()
    with _WaitLog(impl, armed=armed) as log:
        try:
            impl.start_worker(exec, (STUBBORN.format(path=armed), {}), timeout=asked)
        except TimeoutError as e:
            message = str(e)
        else:
            raise Fail("start_worker must raise TimeoutError when the child is not ready in time")
    took = time.monotonic() - started
    _reaped(int(open(armed).read()), "after the timeout")
    _no_children("after the timeout (the child ignores SIGTERM: stop_worker must kill it)")
    named = {int(n) for n in re.findall(r"\d+", message)}
    if not named & log.pids:
        raise Fail("the TimeoutError must name the worker by its pid", got=message,
                   expected=f"one of the worker pids {sorted(log.pids)}")
    if took < asked:
        raise Fail(f"start_worker(timeout={asked}) gave up after {took:.2f} s, before the "
                   f"timeout it was given")
    waited = sum(t for t in log.timeouts if t is not None)
    if waited > asked + 0.01:
        raise Fail(f"start_worker(timeout={asked}) waited {waited:.2f} s in all for a child that "
                   f"never answered (the timeouts it passed to connection.wait: {log.timeouts}): "
                   f"wait at most `timeout` seconds in all")
    marker = os.path.join(tempfile.mkdtemp(), "bye")  # a worker that cleans up on SIGTERM
    step(f"start_worker(a child that cleans up on SIGTERM and never reports, timeout={asked:g})")
    with _WaitLog(impl, armed=marker + ".up"):
        try:
            impl.start_worker(exec, (GRACEFUL.format(path=marker, pause=0), {}), timeout=asked)
        except TimeoutError:
            pass
    if not os.path.exists(marker):
        raise Fail("on the timeout start_worker killed a worker that cleans up on SIGTERM: stop "
                   "it with stop_worker (terminate first)")


def _stop_in_thread(impl, proc, timeout: float) -> float:
    """Run stop_worker(proc, timeout) in a thread; fail if it is still running far past it."""
    done = threading.Event()
    started = time.monotonic()
    thread = threading.Thread(target=lambda: (impl.stop_worker(proc, timeout), done.set()),
                              daemon=True)
    thread.start()
    if not done.wait(timeout + scaled(10)):
        proc.kill()
        proc.join()
        raise Fail(f"stop_worker(process, timeout={timeout}) on a child that ignores SIGTERM was "
                   f"still running after {timeout + scaled(10):.0f} s: join at most `timeout`, "
                   f"then kill")
    return time.monotonic() - started


@test(input="stop_worker on a child that ignores SIGTERM, and on one that cleans up for 0.5 s on "
            "SIGTERM", timeout=40)
def stop_worker_escalates(impl):
    ctx = multiprocessing.get_context("spawn")
    folder = tempfile.mkdtemp()
    stubborn_file, graceful_file = os.path.join(folder, "pid"), os.path.join(folder, "bye")
    stubborn = ctx.Process(target=exec, args=(STUBBORN.format(path=stubborn_file), {}))
    stubborn.start()
    _wait_for_file(stubborn_file, "the child that ignores SIGTERM")
    step(f"stop_worker(a child that ignores SIGTERM, timeout={STOP_TIMEOUT_S:g})")
    os.kill = _recording_kill
    _stop_in_thread(impl, stubborn, STOP_TIMEOUT_S)
    _reaped(stubborn.pid, "a child that ignores SIGTERM")
    if stubborn.is_alive():
        stubborn.kill()
        stubborn.join()
        raise Fail("stop_worker returned while a child that ignores SIGTERM is alive: after "
                   "join(timeout), kill() it and join again")
    graceful = ctx.Process(target=exec, args=(GRACEFUL.format(path=graceful_file, pause=0.5), {}))
    graceful.start()
    _wait_for_file(graceful_file + ".up", "the child that cleans up on SIGTERM")
    step(f"stop_worker(a child that cleans up for 0.5 s on SIGTERM, timeout={scaled(15):.0f})")
    took = _stop_in_thread(impl, graceful, scaled(15))
    if not os.path.exists(graceful_file):
        raise Fail(f"stop_worker(process, timeout={scaled(15):.0f}) killed a worker that was "
                   f"cleaning up after SIGTERM (it needs 0.5 s): terminate() first, give it "
                   f"`timeout` seconds to exit, kill only then (it returned after {took:.1f} s; "
                   f"the worker's exit code: {graceful.exitcode})")


@test(input="start_worker(a child that becomes ready only once the judge lets it, timeout=0)",
      timeout=40)
def timeout_zero(impl):
    gate, got = os.path.join(tempfile.mkdtemp(), "go"), []

    def start():
        try:
            got.append(impl.start_worker(exec, (GATED.format(path=gate), {}), timeout=0))
        except Exception as e:  # noqa: BLE001 - the test looks at what it is
            got.append(e)
    thread = threading.Thread(target=start, daemon=True)
    step("start_worker(a child that becomes ready only once the judge lets it, timeout=0)")
    with _WaitLog(impl) as log:
        thread.start()
        deadline = time.monotonic() + scaled(10)
        while thread.is_alive() and time.monotonic() < deadline:
            if [t for t in log.asked if t is None or t > 0]:
                break  # a wait that the deadline does not allow: no need to wait it out
            thread.join(0.01)
        waited = thread.is_alive()
    unbounded = [t for t in log.asked if t is None or t > 0]
    open(gate, "w").close()  # the child may go on now, whatever start_worker did
    thread.join(scaled(20))
    if got and isinstance(got[0], tuple):
        step("stop_worker(the process start_worker(timeout=0) returned)")
        impl.stop_worker(got[0][0])
        step("start_worker(a child that becomes ready only once the judge lets it, timeout=0)")
    if unbounded:
        raise Fail(f"start_worker(timeout=0) called connection.wait with timeout={unbounded[0]}: "
                   "timeout=0 is a deadline already passed (wait 0 s, then TimeoutError unless "
                   "the child is ready at once), not 'no timeout'")
    if waited:
        raise Fail("start_worker(timeout=0) was still waiting after 10 s: timeout=0 is a "
                   "deadline already passed (TimeoutError at once), not 'no timeout'")
    if not got or not isinstance(got[0], TimeoutError):
        raise Fail("start_worker(timeout=0) of a child that cannot be ready yet must raise "
                   "TimeoutError", got=got[0] if got else "nothing")
    _no_children("after start_worker(timeout=0)")
