"""A per-process Chrome/Perfetto trace recorder: `with tracing.span("forward"): ...`.

Off unless the environment variable MINIVLLM_TRACE_DIR names a directory (`minivllm serve
--trace FILE` sets it before it starts any process, so every child inherits it). Off, `span()`
returns one shared do-nothing context manager: a function call and an attribute test.

On, each process appends its events to `$MINIVLLM_TRACE_DIR/<pid>.jsonl`, one JSON trace event a
line, every FLUSH_EVERY events and at exit (also the exit of a forked multiprocessing child); a
process killed with SIGKILL loses only its last unflushed events. `merge(dir, file)` joins every process's lines into one file in the Trace Event
Format, `{"traceEvents": [...]}`, which ui.perfetto.dev and chrome://tracing open: one track per
process and thread, named by `set_process_name` and by the thread's name.

Event ("ph" is the phase; "X" is a complete span with its duration, times in microseconds):

    {"name": "forward", "ph": "X", "ts": 1234.5, "dur": 870.2, "pid": 4242, "tid": 17, "args": {}}
    {"name": "process_name", "ph": "M", "pid": 4242, "args": {"name": "MINIVLLM::EngineCore_0"}}

Timestamps come from time.perf_counter_ns: CLOCK_MONOTONIC on Linux, one clock for every process
of the machine, so spans of different processes line up. Spans of one thread must nest (Perfetto
draws a thread's spans as a stack), so span only synchronous code, never across an `await`.
"""

from __future__ import annotations

import atexit
import json
import multiprocessing.util
import os
import shutil
import threading
import time
from typing import Any

TRACE_DIR_ENV = "MINIVLLM_TRACE_DIR"
FLUSH_EVERY = 4096  # events buffered before an append: ~0.3 MiB, a write every few seconds


class _NullSpan:
    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_NULL_SPAN = _NullSpan()


class _Span:
    __slots__ = ("recorder", "name", "args", "start")

    def __init__(self, recorder: "_Recorder", name: str, args: dict[str, Any] | None) -> None:
        self.recorder, self.name, self.args = recorder, name, args

    def __enter__(self) -> None:
        self.start = time.perf_counter_ns()

    def __exit__(self, *exc: object) -> None:
        self.recorder.complete(self.name, self.start, time.perf_counter_ns(), self.args)


class _Recorder:
    """The events of this process, appended to its own file."""

    def __init__(self, directory: str) -> None:
        self.pid = os.getpid()
        self.path = os.path.join(directory, f"{self.pid}.jsonl")
        self.events: list[dict[str, Any]] = []
        self.named_threads: set[int] = set()
        self.lock = threading.Lock()
        atexit.register(self.flush)
        # A multiprocessing child started by fork leaves with os._exit, which skips atexit; its
        # _bootstrap runs multiprocessing's finalizers first.
        multiprocessing.util.Finalize(self, self.flush, exitpriority=0)

    def complete(self, name: str, start_ns: int, end_ns: int,
                 args: dict[str, Any] | None = None) -> None:
        tid = threading.get_native_id()
        event = {"name": name, "ph": "X", "ts": start_ns / 1000, "dur": (end_ns - start_ns) / 1000,
                 "pid": self.pid, "tid": tid}
        if args:
            event["args"] = args
        with self.lock:
            if tid not in self.named_threads:
                self.named_threads.add(tid)
                self.events.append(_metadata("thread_name", self.pid, tid,
                                             threading.current_thread().name))
            self.events.append(event)
            full = len(self.events) >= FLUSH_EVERY
        if full:
            self.flush()

    def add(self, event: dict[str, Any]) -> None:
        with self.lock:
            self.events.append(event)

    def flush(self) -> None:
        if os.getpid() != self.pid:  # a forked child inherited this recorder: not its file
            return
        with self.lock:
            events, self.events = self.events, []
        if events:
            with open(self.path, "a") as f:
                f.write("".join(json.dumps(e) + "\n" for e in events))


def _metadata(kind: str, pid: int, tid: int, name: str) -> dict[str, Any]:
    return {"name": kind, "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}}


_recorder: _Recorder | None = None
_recorder_pid = -1  # the process _recorder was decided for; -1: not decided yet


def _get() -> _Recorder | None:
    """This process's recorder, decided on first use (None when tracing is off)."""
    global _recorder, _recorder_pid
    if _recorder_pid == -1:
        directory = os.environ.get(TRACE_DIR_ENV)
        _recorder = _Recorder(directory) if directory and os.path.isdir(directory) else None
        _recorder_pid = os.getpid()
    return _recorder


def _forget_after_fork() -> None:
    """A forked child decides again: the parent's recorder writes the parent's file."""
    global _recorder, _recorder_pid
    _recorder, _recorder_pid = None, -1


os.register_at_fork(after_in_child=_forget_after_fork)


def enabled() -> bool:
    return _get() is not None


def span(name: str, args: dict[str, Any] | None = None) -> Any:
    """A context manager that records one span of this thread; free when tracing is off."""
    recorder = _get()
    return _NULL_SPAN if recorder is None else _Span(recorder, name, args)


def complete(name: str, start_ns: int, end_ns: int, args: dict[str, Any] | None = None) -> None:
    """Record a span measured by the caller (perf_counter_ns times)."""
    recorder = _get()
    if recorder is not None:
        recorder.complete(name, start_ns, end_ns, args)


def set_process_name(name: str) -> None:
    """Name this process's track (e.g. "MINIVLLM::EngineCore_0")."""
    recorder = _get()
    if recorder is not None:
        recorder.add(_metadata("process_name", recorder.pid, 0, name))


def flush() -> None:
    recorder = _get()
    if recorder is not None:
        recorder.flush()


def merge(directory: str, out_file: str, remove: bool = True) -> int:
    """Join every process's events in `directory` into `out_file`; returns the event count.
    A line cut short by a killed process is skipped."""
    events = []
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".jsonl"):
            continue
        path = os.path.join(directory, name)
        with open(path) as f:
            for line in f:
                try:
                    events.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
        if remove:
            os.unlink(path)
    with open(out_file, "w") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)
    if remove:
        shutil.rmtree(directory, ignore_errors=True)
    return len(events)


def load(trace_file: str) -> list[dict[str, Any]]:
    """The events of a merged trace file (for drawing it)."""
    with open(trace_file) as f:
        return json.load(f)["traceEvents"]
