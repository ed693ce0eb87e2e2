"""Child processes the way vLLM starts them: the start method, a ready handshake, a death pipe,
and a shutdown that escalates.

    handle = launch(engine_core_main, "EngineCore", args=(config,), ready_timeout=60)
    handle.ready_message          # what the child passed to link.ready(...)
    handle.shutdown()             # "exited" | "terminated" | "killed": the step that ended it

The child's side (ChildLink, the death-pipe watcher, the entry point) is utils/mp_child.py.
The child's target is called as target(link, *args, **kwargs). It sets itself up, calls
link.ready(message), then works until link.should_stop() (or link.wait_stop()).

Three pipes join parent and child (the first two are vLLM's pair,
vllm/v1/executor/multiproc_executor.py (WorkerProc.make_worker_process)):

    ready pipe  child -> parent   one message: ("ready", message) or ("error", traceback)
    death pipe  parent -> child   b"stop" asks the child to stop; EOF means the parent is gone,
                                  because the kernel closes the parent's end when it dies,
                                  even of SIGKILL
    alive pipe  child -> parent   never written: EOF (ProcHandle.sentinel readable) means the
                                  child is gone

An end only means "gone" while no other process holds a copy, and every fork copies every
descriptor. So a fork made anywhere in a process (launch() or not, os.fork included) closes, in
the new child, the death-pipe ends of that process's children and its own alive-pipe end
(_after_fork_in_child). multiprocessing's own sentinel lacks this: a child's forks keep it open.
"""

from __future__ import annotations

import atexit
import multiprocessing
import multiprocessing.connection
import multiprocessing.util  # noqa: F401  (imported first so that our atexit hook runs before its)
import os
import pickle
import sys
import threading
import time
import weakref
from multiprocessing.context import BaseContext
from typing import Any, Callable

from minivllm.utils import owner_exit
from minivllm.utils.load_scale import stretched, why_stretched
from minivllm.utils.mp_child import _OWN_ALIVE_ENDS, _child_main
from minivllm.utils.mp_child import EXIT_TERMINATED, ChildLink  # noqa: F401  (this API's too)
from minivllm.utils.run_dir import remove_at_exit, remove_process_dir, run_dir

START_METHOD_ENV = "MINIVLLM_WORKER_MULTIPROC_METHOD"  # vLLM's VLLM_WORKER_MULTIPROC_METHOD
DEFAULT_START_METHOD = "fork"  # vLLM's default (VLLM_WORKER_MULTIPROC_METHOD in vllm/envs.py): the cheapest start
START_METHODS = ("fork", "spawn", "forkserver")
READY_TIMEOUT_S = 60.0  # loading the model takes seconds on 2 idle cores; a minute means stuck
# (every ready timeout stretches with the load, up to 4x: utils/load_scale.py)
STOP_GRACE_S = 5.0  # a child leaves its loop this fast after a polite request, or is terminated
TERM_GRACE_S = 2.0  # after SIGTERM, before SIGKILL (vLLM waits 4 s: MultiprocExecutor._ensure_worker_termination)
STOP_REQUEST = b"stop"


# --- the start method ---------------------------------------------------------------------
def cuda_is_initialized() -> bool:
    """True when this process has a CUDA context (that a forked child cannot use)."""
    torch = sys.modules.get("torch")  # never import torch just to ask
    if torch is None or not torch.cuda.is_available():
        return False
    return torch.cuda.is_initialized()


def spawn_reasons() -> list[str]:
    """Why fork is unsafe in this process right now; empty when it is safe."""
    reasons = []
    if cuda_is_initialized():
        reasons.append("CUDA is initialized")
    others = [t.name for t in threading.enumerate()
              if t is not threading.main_thread() and not getattr(t, "fork_safe", False)]
    if others:
        reasons.append(f"{len(others)} threads besides the main thread are running "
                       f"({', '.join(others[:4])}{', ...' if len(others) > 4 else ''})")
    return reasons


def choose_start_method() -> tuple[str, str]:
    """(method, why): the environment variable, else fork, and spawn once fork is unsafe."""
    requested = os.environ.get(START_METHOD_ENV, DEFAULT_START_METHOD)
    if requested not in START_METHODS:
        raise ValueError(f"{START_METHOD_ENV}={requested!r}: choose one of {', '.join(START_METHODS)}")
    source = f"{START_METHOD_ENV}={requested}" if START_METHOD_ENV in os.environ else "the default"
    if requested == "fork":  # spawn and forkserver start from a fresh interpreter
        reasons = spawn_reasons()
        if reasons:
            return "spawn", f"spawn forced instead of fork: {'; '.join(reasons)}"
    return requested, f"{requested} from {source}"


def get_mp_context() -> BaseContext:
    """The multiprocessing context minivllm starts its processes with."""
    return multiprocessing.get_context(choose_start_method()[0])


# --- errors ---------------------------------------------------------------------------------
class ChildStartError(RuntimeError):
    """The child failed, or died, before it reported ready."""


class ReadyTimeoutError(TimeoutError):
    """The child is alive but did not report ready in time."""


# --- the parent's side ----------------------------------------------------------------------
REAP_POLL_S = 0.001  # after the alive pipe closes the child is a zombie within moments


def _join(process, alive, timeout: float) -> None:
    """Wait at most timeout s for the child to exit, on the alive pipe (process.join(timeout)
    waits on multiprocessing's sentinel, which the child's own forks may hold open)."""
    deadline = time.monotonic() + timeout
    if multiprocessing.connection.wait([alive], timeout):
        while process.is_alive() and time.monotonic() < deadline:  # is_alive() reaps
            time.sleep(REAP_POLL_S)


def _escalate(process, death_writer, alive, stop_timeout: float, term_timeout: float) -> str:
    """Ask, then SIGTERM, then SIGKILL; returns the step that ended the process."""
    how = "exited"
    if process.is_alive():
        try:
            death_writer.send_bytes(STOP_REQUEST)
        except OSError:
            pass  # the child is already gone
        _join(process, alive, stop_timeout)
    if process.is_alive():
        how = "terminated"
        process.terminate()
        _join(process, alive, term_timeout)
    if process.is_alive():
        how = "killed"
        process.kill()
        process.join()
    death_writer.close()
    remove_process_dir(process.pid)  # the socket files it could not remove if it was killed
    return how


_LIVE: "weakref.WeakSet[ProcHandle]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """In every new fork: drop the copies that would hide a death (see the module docstring).
    The parent's children are not ours to stop either."""
    for handle in list(_LIVE):
        handle._finalizer.detach()
        handle._death_writer.close()
        _LIVE.discard(handle)
    for conn in _OWN_ALIVE_ENDS:
        conn.close()
    _OWN_ALIVE_ENDS.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


class ProcHandle:
    """The parent's handle on one launched child. Use as a context manager, or call shutdown()."""

    def __init__(self, name: str, process, death_writer, alive_reader):
        self.name, self.process = name, process
        self.ready_message: Any = None
        self.shutdown_how: str | None = None
        self._death_writer, self._alive = death_writer, alive_reader
        self._finalizer = weakref.finalize(self, _escalate, process, death_writer, alive_reader,
                                           STOP_GRACE_S, TERM_GRACE_S)
        _LIVE.add(self)

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def sentinel(self) -> int:
        """A file descriptor that becomes readable when the child exits (for select/poll):
        the alive pipe, which, unlike process.sentinel, the child's own forks do not hold."""
        return self._alive.fileno()

    def is_alive(self) -> bool:
        return self.process.is_alive()

    def exit_code(self, timeout: float = 1.0) -> int | None:
        """The child's exit code, waiting at most timeout s for it. Two threads that reap one
        child race: the loser's waitpid gets ECHILD and multiprocessing reports None until the
        winner has stored the code, so this asks again instead of trusting one join."""
        deadline = time.monotonic() + timeout
        while (code := self.process.exitcode) is None and time.monotonic() < deadline:
            self.process.join(0.01)
        return code

    def request_stop(self) -> None:
        """The polite step alone: the child's link.should_stop() becomes True."""
        if not self._death_writer.closed:
            try:
                self._death_writer.send_bytes(STOP_REQUEST)
            except OSError:
                pass

    def shutdown(self, timeout: float = STOP_GRACE_S, term_timeout: float = TERM_GRACE_S) -> str:
        """Stop the child: request, wait `timeout` s, SIGTERM, wait, SIGKILL. Idempotent."""
        if self._finalizer.alive:
            self._finalizer.detach()
            self.shutdown_how = _escalate(self.process, self._death_writer, self._alive, timeout,
                                          term_timeout)
            _LIVE.discard(self)
        return self.shutdown_how or "exited"

    def __enter__(self) -> "ProcHandle":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        state = self.shutdown_how or ("alive" if self.is_alive() else "exited")
        return f"<ProcHandle {self.name} pid={self.pid} {state}>"


def _wait_ready(handle: ProcHandle, ready_reader, timeout: float) -> Any:
    """The child's ready message, within `timeout` s stretched for the load (a busy machine
    starts a child slower: utils/load_scale.py)."""
    who = f"{handle.name} (pid {handle.pid})"
    limit = stretched(timeout)
    ready = multiprocessing.connection.wait([ready_reader, handle.sentinel], limit)
    if ready_reader in ready:
        try:
            kind, payload = ready_reader.recv()
        except EOFError:
            kind, payload = "died", None
        if kind == "ready":
            return payload
        if kind == "error":
            advice = ""
            if "Can't get attribute" in payload or "__main__" in payload:
                advice = ("\nThe child could not find the target: define it at the top level of an "
                          "importable module, not in __main__ (a notebook or an unguarded script).")
            raise ChildStartError(f"{who} failed before it reported ready:\n{payload}{advice}")
    if ready or not handle.is_alive():
        handle.process.join(1.0)
        raise ChildStartError(f"{who} exited with code {handle.process.exitcode} before it "
                              "reported ready; see its output above")
    raise ReadyTimeoutError(f"{who} did not report ready within {timeout:g} s"
                            f"{why_stretched(timeout, limit)}: it is stuck or slow. See its "
                            "log above, or pass a larger ready_timeout")


def _check_main_reimportable(method: str, name: str) -> None:
    """A spawn or forkserver child re-runs the parent's __main__ from its file: refuse at once,
    with what to do, where that file does not exist (a script piped in on stdin is '<stdin>'),
    instead of letting each child die in its own FileNotFoundError traceback."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if getattr(main, "__spec__", None) is not None or path is None or os.path.exists(path):
        return
    raise ChildStartError(
        f"cannot start {name} with {method}: a {method} child re-imports your main script, and "
        f"{path!r} is not a file it can read (a script piped in on stdin?). Save the script to a "
        f"file and run `python file.py`")


def launch(target: Callable[..., Any], name: str, args: tuple = (), kwargs: dict | None = None,
           *, ready_timeout: float = READY_TIMEOUT_S, context: BaseContext | None = None,
           daemon: bool = False) -> ProcHandle:
    """Start target(link, *args, **kwargs) in a child and wait until it calls link.ready().

    Raises ChildStartError if the child fails or dies first, ReadyTimeoutError if it takes
    longer than ready_timeout; either way the child is stopped before the error is raised.
    A daemon child is killed when the parent exits normally, but may not start children.
    """
    ctx = context or get_mp_context()
    forking = ctx.get_start_method() == "fork"
    # Pickle the target here, so that a target the child cannot import is reported, not lost.
    # (args are pickled by multiprocessing, which can pass pipes and sockets to a spawn child.)
    sent_target: Any = target
    if not forking:
        _check_main_reimportable(ctx.get_start_method(), name)
        try:
            sent_target = pickle.dumps(target)
        except (pickle.PicklingError, AttributeError, TypeError) as e:
            raise ChildStartError(f"cannot send the target of {name} to a {ctx.get_start_method()} "
                                  f"child: {e}. Define it at the top level of a module") from e
    run_dir()  # made before the child starts, so that the child's socket files go there too
    owner_exit.on_terminate(_shutdown_quickly)
    owner_exit.on_terminate(remove_at_exit)
    ready_reader, ready_writer = ctx.Pipe(duplex=False)
    death_reader, death_writer = ctx.Pipe(duplex=False)
    alive_reader, alive_writer = ctx.Pipe(duplex=False)
    parent_ends = [ready_reader, death_writer, alive_reader] if forking else []
    process = ctx.Process(target=_child_main, name=name, daemon=daemon,
                          args=(sent_target, tuple(args), dict(kwargs or {}), name, ready_writer,
                                death_reader, alive_writer, parent_ends, os.getpid()))
    process.start()
    for end in (ready_writer, death_reader, alive_writer):  # the child holds these ends now
        end.close()
    handle = ProcHandle(name, process, death_writer, alive_reader)
    try:
        handle.ready_message = _wait_ready(handle, ready_reader, ready_timeout)
    except BaseException:
        handle.shutdown(timeout=0.0)
        raise
    finally:
        ready_reader.close()
    return handle


@atexit.register
def _shutdown_all(grace_s: float = STOP_GRACE_S) -> None:
    """At exit, stop children the program forgot, before multiprocessing joins them forever."""
    for handle in list(_LIVE):
        handle.shutdown(timeout=grace_s, term_timeout=min(grace_s, TERM_GRACE_S))


def _shutdown_quickly() -> None:
    """The owner is being terminated: its children get a short grace (utils/owner_exit.py)."""
    _shutdown_all(owner_exit.CLEANUP_GRACE_S)
