"""The judge's tests for exercise 101. Each receives the learner's module as `impl`."""

import multiprocessing
import os

from minivllm.judge.api import Fail, check_equal, test


def _no_children(what):
    left = multiprocessing.active_children()
    if left:
        for p in left:
            p.kill()
            p.join()
        raise Fail(f"{what}: a worker process was left running; stop it before raising",
                   got=[p.pid for p in left])


@test(input="start_worker(setup_ok, (21,))", timeout=15)
def ready_handshake(impl):
    proc, result = impl.start_worker(impl.setup_ok, (21,), timeout=10)
    try:
        check_equal(result, 42, "the ready result (setup_ok(21))")
        check_equal(type(proc).__name__, "SpawnProcess",
                    "the kind of process (spawn: fork is unsafe once threads or CUDA exist)")
        if proc.pid == os.getpid():
            raise Fail("the target ran in the judge's process, not in a child")
    finally:
        impl.stop_worker(proc)
    if proc.is_alive():
        raise Fail("stop_worker returned while the process is alive")


def _expect_start_error(impl, target: str, timeout: float, text: str, what: str) -> None:
    """start_worker(impl.<target>) must raise WorkerStartError whose message holds `text`."""
    try:
        impl.start_worker(getattr(impl, target), (), timeout=timeout)
    except impl.WorkerStartError as e:
        if text not in str(e):
            raise Fail(what, expected=f"...{text}...", got=str(e))
    else:
        raise Fail(f"start_worker({target}) must raise WorkerStartError")


@test(input="start_worker(setup_fails)", timeout=15)
def error_reaches_the_parent(impl):
    _expect_start_error(impl, "setup_fails", 10, "boom", "WorkerStartError must carry the child's "
                        "error text")
    _no_children("after a failed start")


@test(input="start_worker(setup_dies) with timeout=30", timeout=12,
      hang="the child died at once, but start_worker kept waiting: also wait on process.sentinel")
def child_dies_before_ready(impl):
    _expect_start_error(impl, "setup_dies", 30, "exit code 3", "the error must give the child's "
                        "exit code")
    _no_children("after the child died")


@test(input="start_worker(setup_slow, (60,), timeout=1)", timeout=12,
      hang="start_worker waited for the message with no time limit")
def timeout_stops_the_child(impl):
    try:
        impl.start_worker(impl.setup_slow, (60,), timeout=1)
    except TimeoutError as e:
        if "pid" not in str(e):
            raise Fail("the TimeoutError must name the worker (its pid)", got=str(e))
    else:
        raise Fail("start_worker must raise TimeoutError when the child is not ready in time")
    _no_children("after the timeout")
