"""minivllm.utils.tracing: off by default and free; on, every process writes its own events and
merge() joins them into one Chrome/Perfetto trace with named process and thread tracks."""

from __future__ import annotations

import json
import multiprocessing
import os
import threading

from minivllm.utils import tracing


def _child_work(directory: str) -> None:
    os.environ[tracing.TRACE_DIR_ENV] = directory
    tracing.set_process_name("child")
    with tracing.span("forward", {"batch": 4}):
        pass
    tracing.flush()


def _forked_work() -> None:
    with tracing.span("forked"):  # no flush: the fork child's exit must write it
        pass


def test_off_by_default_records_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv(tracing.TRACE_DIR_ENV, raising=False)
    monkeypatch.setattr(tracing, "_recorder_pid", -1)
    assert not tracing.enabled()
    with tracing.span("x"):
        pass
    assert tracing.span("x") is tracing.span("y")  # one shared no-op object
    assert list(tmp_path.iterdir()) == []


def test_processes_and_threads_merge_into_one_trace(tmp_path, monkeypatch):
    directory = tmp_path / "events"
    directory.mkdir()
    monkeypatch.setenv(tracing.TRACE_DIR_ENV, str(directory))
    monkeypatch.setattr(tracing, "_recorder_pid", -1)
    tracing.set_process_name("parent")
    with tracing.span("outer"):
        with tracing.span("inner"):
            pass
    def in_thread() -> None:
        with tracing.span("in_thread"):
            pass
    t = threading.Thread(target=in_thread, name="helper")
    t.start()
    t.join()
    proc = multiprocessing.get_context("spawn").Process(target=_child_work,
                                                        args=(str(directory),))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0
    forked = multiprocessing.get_context("fork").Process(target=_forked_work)
    forked.start()
    forked.join(60)
    assert forked.exitcode == 0
    tracing.flush()
    with open(directory / "garbage.jsonl", "w") as f:
        f.write('{"name": "cut sh')  # a process killed mid-write: skipped, not fatal
    out = tmp_path / "trace.json"
    n = tracing.merge(str(directory), str(out))
    events = json.load(open(out))["traceEvents"]
    assert n == len(events) and not directory.exists()
    spans = {e["name"]: e for e in events if e["ph"] == "X"}
    assert {"outer", "inner", "in_thread", "forward", "forked"} <= set(spans)
    outer, inner = spans["outer"], spans["inner"]
    assert outer["ts"] <= inner["ts"] and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"]
    assert spans["forward"]["pid"] == proc.pid and spans["forward"]["args"] == {"batch": 4}
    names = {(e["name"], e["args"]["name"]) for e in events if e["ph"] == "M"}
    assert {("process_name", "parent"), ("process_name", "child"),
            ("thread_name", "helper")} <= names
