"""Grade one file against an exercise's tests: each test in its own process group, with a
time limit, followed by a sweep for leaked processes, shared memory and socket files."""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from minivllm.judge import api
from minivllm.judge.child import load_tests
from minivllm.judge.exercise import ROOT, Exercise
from minivllm.utils.leaks import Snapshot

RUN_MARKER = "MINIVLLM_JUDGE_RUN"  # set in the child's environment to find its descendants
OUTPUT_TAIL_LINES = 15
LEAK_SETTLE_S = 0.5
DEFAULT_HANG = ("A hang here usually means a loop waiting for a flag or a message that "
                "nobody will ever set or send.")


@dataclass
class Grade:
    exercise: Exercise
    path: Path
    results: list[dict] = field(default_factory=list)

    @property
    def failures(self) -> list[dict]:
        return [r for r in self.results if r["status"] == "fail"]

    @property
    def passed(self) -> bool:
        """Everything that ran passed, and something ran (SKIP never counts as PASS)."""
        ran = [r for r in self.results if r["status"] in ("pass", "fail")]
        return bool(ran) and not self.failures and all(r["status"] != "not run" for r in self.results)

    def to_json(self) -> dict:
        return {"exercise": self.exercise.number, "title": self.exercise.title,
                "file": str(self.path), "passed": self.passed, "tests": self.results}


@functools.cache
def has_capability(name: str) -> bool:
    if name == "cuda":
        probe = "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"
        return subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0
    return False


def grade(ex: Exercise, path: Path, stop_at_first_failure: bool = True) -> Grade:
    result = Grade(ex, path)
    _, specs = load_tests(str(ex.tests))
    for spec in specs:
        missing = [c for c in ex.requires + spec.requires if not has_capability(c)]
        if missing:
            result.results.append({"name": spec.name, "status": "skip", "input": spec.input,
                                   "message": f"needs {', '.join(missing)}, which this machine lacks"})
        elif stop_at_first_failure and result.failures:
            result.results.append({"name": spec.name, "status": "not run", "input": spec.input,
                                   "message": "not run: an earlier test failed"})
        else:
            result.results.append(run_test(ex, path, spec))
    return result


def run_test(ex: Exercise, path: Path, spec: api.TestSpec) -> dict:
    work = Path(tempfile.mkdtemp(prefix=f"judge-{ex.number}-"))
    try:
        shutil.copy(path, work / f"{ex.module_name}.py")
        (work / "tmp").mkdir()
        # Sockets: anywhere in the child's private TMPDIR, and directly in /tmp (a hard-coded
        # path); not deeper in /tmp, where other programs on the machine keep theirs.
        before = Snapshot(socket_roots=[(str(work / "tmp"), 4), (tempfile.gettempdir(), 1)])
        token = uuid.uuid4().hex
        res, out_text = _run_child(ex, spec, work, token)
        _add_leaks(res, before, token)
        if res["status"] != "pass" and out_text.strip():
            res["output"] = "\n".join(out_text.rstrip().splitlines()[-OUTPUT_TAIL_LINES:])
        return res
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run_child(ex: Exercise, spec: api.TestSpec, work: Path, token: str) -> tuple[dict, str]:
    result_path, log_path = work / "result.json", work / "output.log"
    env = dict(os.environ, **{RUN_MARKER: token, "TMPDIR": str(work / "tmp"),
                              "PYTHONPATH": os.pathsep.join([str(work), str(ROOT)])})
    cmd = [sys.executable, "-m", "minivllm.judge.child", str(ex.tests), str(work),
           ex.module_name, spec.name, str(result_path)]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True, cwd=work)
        try:
            proc.wait(timeout=spec.timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
        _kill_group(proc.pid)
        proc.wait()
    out_text = log_path.read_text(errors="replace")
    if timed_out:
        return ({"name": spec.name, "status": "fail", "kind": "timeout", "input": spec.input,
                 "seconds": spec.timeout,
                 "message": f"timed out after {spec.timeout:g} s; the judge stopped it and "
                            f"everything it started. {spec.hang or DEFAULT_HANG}"}, out_text)
    if not result_path.exists():
        return ({"name": spec.name, "status": "fail", "kind": "error", "input": spec.input,
                 "message": f"the test process died with exit code {proc.returncode} before "
                            "reporting (a crash in native code, os._exit, or a signal)"}, out_text)
    return json.loads(result_path.read_text()), out_text


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _marked_processes(token: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter():
        try:
            if p.environ().get(RUN_MARKER) == token:
                found.append(p)
        except psutil.Error:
            continue
    return found


def _add_leaks(res: dict, before: Snapshot, token: str) -> None:
    # The process group is already killed; give the kernel a moment to tear it down, so
    # that what is still alive is what escaped the group (a daemon, a setsid child).
    leaks = before.leaks(settle=LEAK_SETTLE_S, extra_processes=_marked_processes(token))
    if not leaks:
        return
    messages = []
    if leaks.processes and res.get("kind") != "timeout":
        messages.append("your code left a process running: " + "; ".join(leaks.processes)
                        + ". Join or terminate every process you start.")
    if leaks.segments:
        messages.append("your code left a shared-memory segment behind: "
                        + ", ".join(f"/dev/shm/{s}" for s in leaks.segments)
                        + ". Every process must close() it, and its creator must unlink() it once.")
    if leaks.sockets:
        messages.append("your code left an ipc socket file behind: " + ", ".join(leaks.sockets)
                        + ". Close the socket (and remove its file) before the process exits.")
    if not messages:
        return
    res["leaks"] = messages
    if res["status"] == "pass":
        res.update(status="fail", kind="leak", message="\n".join(messages))
