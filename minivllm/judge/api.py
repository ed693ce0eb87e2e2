"""What an exercise's tests.py uses: the @test decorator and the Fail exception.

A test is a function taking the learner's module. It raises Fail with what was expected,
what happened and on which input (or returns a short note on what it checked); anything else it raises is reported as an error in the
learner's code. Tests run in the order they are defined, each in its own child process.

The `input:` line of a failure names the call that failed: a test that makes several calls says
which one comes next with step(...); a failure without an input of its own (a Fail, a crash, a
hang) reports the last step. A crash with no step is named by the call into the learner's code
that raised (call_in_traceback).
"""

from __future__ import annotations

import os
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

_MISSING = object()
REGISTRY: list["TestSpec"] = []
DEFAULT_TIMEOUT_S = 10.0
ARG_CHARS = 60  # an argument shown on the input line is clipped to this
_steps: list[str] = []  # the steps this test said it takes, the last one current
_step_sink: list[Callable[[str], None]] = []  # the child's report to the judge (hangs)


@dataclass
class TestSpec:
    name: str
    fn: Callable[[Any], None]
    input: str = ""
    timeout: float = DEFAULT_TIMEOUT_S
    hang: str = ""  # what a hang in this test usually means
    requires: tuple[str, ...] = field(default_factory=tuple)


def test(*, input: str = "", timeout: float = DEFAULT_TIMEOUT_S, hang: str = "",
         requires: tuple[str, ...] = ()):
    """Register a test; its name is the function's name."""
    def register(fn):
        REGISTRY.append(TestSpec(fn.__name__, fn, input, timeout, hang, tuple(requires)))
        return fn
    return register


class Fail(AssertionError):
    """A wrong result: expected vs got, on an input."""

    def __init__(self, message: str, *, expected: Any = _MISSING, got: Any = _MISSING,
                 input: str | None = None, detail: str = ""):
        super().__init__(message)
        self.message, self.input, self.detail = message, input, detail
        self.expected = None if expected is _MISSING else _show(expected)
        self.got = None if got is _MISSING else _show(got)
        self.differs = None  # large values: where they first differ, in one line (judge.diff)
        if expected is not _MISSING and got is not _MISSING:
            from minivllm.judge.diff import summarise
            first = summarise(expected, got)
            if first is not None:
                self.differs, self.expected, self.got = first.line(), first.expected, first.got


def step(input: str) -> None:
    """Say which call the test makes next: from here on a failure (a Fail with no input of its
    own, a crash, a hang the judge stops) names it on its `input:` line."""
    _steps.append(input)
    for sink in _step_sink:
        sink(input)


def current_step() -> str | None:
    return _steps[-1] if _steps else None


def failed_input(step: str | None, call: str, whole: str) -> str:
    """A failure's `input:` line: the call found in the learner's code (the one that raised, or
    that hung), unless the test's last step names that function (it says more); else the last
    step; else the test's whole input."""
    if call and not (step and call.split("(")[0].split(".")[-1] in step):
        return call
    return step or whole


def call_in_traceback(tb, impl_dir: str) -> str:
    """The call into the learner's code that raised, as `name(arg=value, ...)` from the first
    traceback frame in impl_dir (its arguments as they were when it raised); '' if none."""
    import inspect
    while tb is not None and not tb.tb_frame.f_code.co_filename.startswith(impl_dir):
        tb = tb.tb_next
    if tb is None or tb.tb_frame.f_code.co_name.startswith("<"):
        return ""
    frame = tb.tb_frame
    info = inspect.getargvalues(frame)
    names, name = list(info.args), frame.f_code.co_name
    if names and names[0] in ("self", "cls"):
        owner = frame.f_locals.get(names.pop(0))
        cls = owner if isinstance(owner, type) else type(owner)
        name = cls.__name__ if name == "__init__" else f"{cls.__name__}.{name}"
    shown = [f"{n}={_short(frame.f_locals.get(n))}" for n in names]
    if info.varargs:
        shown += [_short(v) for v in frame.f_locals.get(info.varargs, ())]
    if info.keywords:
        shown += [f"{k}={_short(v)}" for k, v in frame.f_locals.get(info.keywords, {}).items()]
    return f"{name}({', '.join(shown)})"


def _short(value: Any) -> str:
    """A value as the input line shows it: a function by its name, an object whose repr is
    <...> (an address, or a state that may have changed since: a socket the test closed) by
    its type, anything else by a repr clipped to ARG_CHARS."""
    if callable(value) and hasattr(value, "__name__") and not isinstance(value, type):
        return value.__name__
    text = repr(value)
    if text.startswith("<"):
        return f"<{type(value).__name__}>"
    return text if len(text) <= ARG_CHARS else text[:ARG_CHARS - 3] + "..."


def scaled(seconds: float) -> float:
    """A wait that only detects a lost message, stretched as the judge stretches time limits on
    a busy machine (runner.time_scale), so that slowness is never taken for a loss."""
    return seconds * float(os.environ.get("MINIVLLM_JUDGE_TIME_SCALE") or 1)


def check_equal(got: Any, expected: Any, what: str, input: str | None = None) -> None:
    if got != expected:
        raise Fail(f"{what} is wrong", expected=expected, got=got, input=input)


def learner_frame(tb, impl_dir: str) -> str:
    """The learner's last line in a traceback ('f() at line N: source'), or '' if none."""
    frames = [f for f in traceback.extract_tb(tb) if f.filename.startswith(impl_dir)]
    if not frames:
        return ""
    f = frames[-1]
    return f"{f.name}() at line {f.lineno}: {f.line}"


def kill_if_alive(*procs: Any) -> None:
    """A test's teardown of the processes it started: SIGKILL each one still running and reap
    it (a subprocess.Popen, whose pipes are drained too, or a multiprocessing.Process)."""
    for proc in procs:
        if hasattr(proc, "poll"):  # subprocess.Popen
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        elif proc.is_alive():
            proc.kill()
            proc.join()


def _show(value: Any, limit: int = 300) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"


class EngineBench:
    """A learner's object and judge engine threads (each with a `stop` Event) on one zmq
    Context and one IpcDir; leaving the `with` closes them in that order, whatever the test
    did. A subclass sets self.learner (anything with close()) and self.engines."""

    def __init__(self) -> None:
        import zmq

        from minivllm.utils.zmq import IpcDir
        self.ctx, self.d = zmq.Context(), IpcDir()
        self.learner: Any = None
        self.engines: list = []

    def __enter__(self) -> "EngineBench":
        return self

    def __exit__(self, *exc: Any) -> None:
        for e in self.engines:
            e.stop.set()
            e.join(2)
        try:
            if self.learner is not None:
                self.learner.close()
        finally:
            self.ctx.term()
            self.d.close()
