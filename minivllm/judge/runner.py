"""Grade one file against an exercise's tests: each test in its own child process, with a time
limit and a memory limit, followed by a sweep for what it left behind.

The children are forked by a zygote (zygote.py) that imported the tests' modules once, torch
included, so a test starts in milliseconds; the learner's module and tests.py itself are still
loaded afresh in each child.

The child gets a private TMPDIR and its own resource prefix (resource_names), so the sweep
blames only what the learner's code made. The judge is a child subreaper: a process that
escapes the child's group (double fork, setsid, exec with an empty environment) re-parents to
the judge and is found and killed. The child reports its verdict over a pipe the judge holds;
its output comes back over another pipe, of which only the tail is kept.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from minivllm.judge import api, hang
from minivllm.judge.child import load_tests
from minivllm.judge.exercise import ROOT, Exercise
from minivllm.judge.zygote import ForkedTest, Zygote
from minivllm.utils.leaks import Snapshot, become_subreaper, kill_processes
from minivllm.utils.load_scale import load_scale
from minivllm.utils.resource_names import PREFIX_ENV

FORK_ENV = "MINIVLLM_JUDGE_FORK"  # "0": each test in a fresh interpreter, not forked warm
RUN_MARKER = "MINIVLLM_JUDGE_RUN"  # in the child's environment: a second way to find escapees
MEMORY_ENV = "MINIVLLM_JUDGE_MEMORY_MIB"
MEMORY_MIB = int(os.environ.get(MEMORY_ENV, 4096))  # address space per process; torch needs ~1 GiB
IMPORT_LIMIT_S = 120.0  # importing the tests and the learner's module (torch takes seconds)
TIME_SCALE_ENV = "MINIVLLM_JUDGE_TIME_SCALE"
OUTPUT_TAIL_LINES = 15
OUTPUT_TAIL_BYTES = 4096  # what is shown of the output: 50 MB on one line must not flood a terminal
OUTPUT_LINE_CHARS = 240
LEAK_SETTLE_S = 0.5
TRACKER_EXIT_S = 2.0  # a resource tracker unlinks what its dead clients left, then exits
SHORT_TEMP_ROOT = 24  # chars; the child's sockets nest 4 folders deeper, ~80 more
DEFAULT_HANG = ("A hang here usually means a loop waiting for a flag or a message that "
                "nobody will ever set or send.")
_run_ids = itertools.count()


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


class UnknownTest(ValueError):
    """--first named a test the exercise does not have."""


def grade(ex: Exercise, path: Path, stop_at_first_failure: bool = True,
          first: tuple[str, ...] = ()) -> Grade:
    """Run the exercise's tests on `path`, in file order except that the tests named in `first`
    go first (a mutation sweep runs the test that killed a mutant last time before the rest)."""
    become_subreaper()
    result = Grade(ex, path)
    with _sigterm_as_exit():
        forks = _start_zygote(ex)
        try:
            listed = forks.specs() if forks else []
            # the zygote imported the tests (torch and all) so that this process need not
            specs = ([api.TestSpec(fn=None, **{**s, "requires": tuple(s["requires"])})
                      for s in listed] or load_tests(str(ex.tests))[1])
            unknown = set(first) - {s.name for s in specs}
            if unknown:
                raise UnknownTest(f"exercise {ex.number} has no test named {sorted(unknown)}")
            for spec in sorted(specs, key=lambda s: s.name not in first):
                _grade_one(ex, path, spec, result, stop_at_first_failure, forks)
        finally:
            if forks:
                forks.close()
    return result


@contextlib.contextmanager
def _sigterm_as_exit():
    """SIGTERM's default is to die at once, leaving the test processes, which run in sessions of
    their own, to run on (or stay stopped, for a test that stops a peer). As SystemExit instead,
    the cleanup runs: the test's group killed, the zygote closed. Only where nothing else handles
    SIGTERM, from the main thread (where Python runs handlers), and only while grading."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL):
        yield
        return
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _start_zygote(ex: Exercise) -> Zygote | None:
    """The warm parent of this grade's test processes (minivllm.judge.zygote); None when
    MINIVLLM_JUDGE_FORK=0 asks for a fresh interpreter per test."""
    if os.environ.get(FORK_ENV, "1") == "0":
        return None
    env = dict(os.environ, **{PREFIX_ENV: f"minivllm-j{os.getpid()}zygote",
                              "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get(
                                  "PYTHONPATH", "")]).rstrip(os.pathsep)})
    return Zygote(str(ex.tests), env)


def _grade_one(ex: Exercise, path: Path, spec: api.TestSpec, result: Grade,
               stop_at_first_failure: bool, forks: Zygote | None) -> None:
    missing = [c for c in ex.requires + spec.requires if not has_capability(c)]
    if missing:
        result.results.append({"name": spec.name, "status": "skip", "input": spec.input,
                               "message": f"needs {', '.join(missing)}, which this machine lacks"})
    elif stop_at_first_failure and result.failures:
        result.results.append({"name": spec.name, "status": "not run", "input": spec.input,
                               "message": "not run: an earlier test failed"})
    else:
        result.results.append(run_test(ex, path, spec, forks))


def run_test(ex: Exercise, path: Path, spec: api.TestSpec, forks: Zygote | None = None) -> dict:
    work = Path(tempfile.mkdtemp(prefix=f"judge-{ex.number}-", dir=_short_temp_root()))
    try:
        shutil.copy(path, work / f"{ex.module_name}.py")
        (work / "tmp").mkdir()
        prefix = f"minivllm-j{os.getpid()}x{next(_run_ids)}"
        before = Snapshot(prefix, private_dirs=[str(work)],
                          socket_roots=[(tempfile.gettempdir(), 1)])
        token = uuid.uuid4().hex
        res, out = _run_child(ex, spec, work, prefix, token, forks)
        _add_leaks(res, before, token)
        out.join()
        if res["status"] != "pass" and out.text.strip():
            res["output"] = out.text
        return res
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _short_temp_root() -> str:
    """The temp dir, or /tmp when that is long (the test suite's private TMPDIR): ipc socket
    paths made under the child's TMPDIR must fit in a Unix socket address (107 bytes)."""
    root = tempfile.gettempdir()
    if len(root) > SHORT_TEMP_ROOT and os.access("/tmp", os.W_OK):
        return "/tmp"
    return root


def time_scale() -> float:
    """Time limits guard against hangs, never decide a verdict: on a busy machine (load above
    the core count) they stretch, up to 4x, as minivllm's own start timeouts do
    (utils/load_scale.py). MINIVLLM_JUDGE_TIME_SCALE sets the factor."""
    if os.environ.get(TIME_SCALE_ENV):
        return float(os.environ[TIME_SCALE_ENV])
    return load_scale()


class _Tail(threading.Thread):
    """Drains a pipe, keeping only its last bytes; `ready` is set when a line "ready" came.
    With verdict=True it stops at the first complete JSON line (the child's verdict: one from
    a process the learner's code forked may follow) and keeps the last step line."""

    def __init__(self, fd: int, keep: int, verdict: bool = False):
        super().__init__(daemon=True)
        self.fd, self.keep, self.verdict = fd, keep, verdict
        self.data, self.total = b"", 0
        self.ready = threading.Event()
        self.start()

    def run(self) -> None:
        with open(self.fd, "rb", buffering=0, closefd=True) as f:
            while chunk := f.read(65536):
                self.total += len(chunk)
                self.data = (self.data + chunk)[-self.keep:] if self.keep else self.data + chunk
                if self.data.startswith(b"ready\n"):
                    self.ready.set()
                if self.verdict and self.result_line() is not None:
                    return

    def result_line(self) -> bytes | None:
        """The verdict: the first complete line that is not "ready" or a step."""
        return next((ln for ln in self.data.split(b"\n")[:-1] if ln.startswith(b"{")), None)

    def last_step(self) -> str | None:
        """The input of the last api.step the test took before its verdict, if any."""
        steps = [ln for ln in self.data.split(b"\n")[:-1] if ln.startswith(b"step ")]
        return json.loads(steps[-1][5:]) if steps else None

    def join(self, timeout: float = 5.0) -> None:
        super().join(timeout)

    @property
    def text(self) -> str:
        lines = self.data.decode(errors="replace").rstrip().splitlines()[-OUTPUT_TAIL_LINES:]
        lines = [ln if len(ln) <= OUTPUT_LINE_CHARS else
                 ln[:OUTPUT_LINE_CHARS] + f"... ({len(ln):,} chars in this line)" for ln in lines]
        if self.total > len(self.data):
            lines.insert(0, f"({self.total:,} bytes in all; the last ones follow)")
        return "\n".join(lines)


def _run_child(ex: Exercise, spec: api.TestSpec, work: Path, prefix: str,
               token: str, forks: Zygote | None) -> tuple[dict, _Tail]:
    scale = time_scale()
    env = dict(os.environ, **{RUN_MARKER: token, PREFIX_ENV: prefix, "TMPDIR": str(work / "tmp"),
                              MEMORY_ENV: str(MEMORY_MIB), TIME_SCALE_ENV: f"{scale:.2f}",
                              "PYTHONPATH": os.pathsep.join(filter(None, [  # the caller's last
                                  str(work), str(ROOT), os.environ.get("PYTHONPATH")]))})
    verdict_r, verdict_w = os.pipe()
    out_r, out_w = os.pipe()
    argv = [str(ex.tests), str(work), ex.module_name, spec.name]
    try:
        proc = forks.fork(argv, env, str(work), [out_w, verdict_w]) if forks else None
        if proc is None:
            proc = subprocess.Popen([sys.executable, "-m", "minivllm.judge.child", *argv],
                                    stdin=subprocess.PIPE, stdout=out_w, stderr=out_w, env=env,
                                    start_new_session=True, cwd=work, pass_fds=(verdict_w,))
            # the fd number: never in argv or the environment
            proc.stdin.write(f"{verdict_w}\n".encode())
            proc.stdin.close()
    finally:
        os.close(verdict_w)
        os.close(out_w)
    verdict, out = _Tail(verdict_r, 0, verdict=True), _Tail(out_r, OUTPUT_TAIL_BYTES)
    limit = spec.timeout * scale
    try:
        hung, stacks = _wait(proc, verdict, limit)
    except BaseException:  # Ctrl-C or SIGTERM while a test runs: its own session, so kill it
        _kill_group(proc.pid)
        raise
    verdict.join(1.0)
    if hung:
        if hung.startswith("timed out"):
            hung += spec.hang or DEFAULT_HANG
        call = hang.hung_call(stacks, str(work / f"{ex.module_name}.py"), str(ex.tests))
        return ({"name": spec.name, "status": "fail", "kind": "timeout",
                 "input": api.failed_input(verdict.last_step(), call, spec.input),
                 "seconds": round(limit, 1), "message": hung}, out)
    try:
        return json.loads(verdict.result_line() or b""), out
    except ValueError:
        return _died(spec, proc.returncode, verdict.last_step()), out


def _wait(proc: subprocess.Popen | ForkedTest, verdict: _Tail, limit: float) -> tuple[str, bytes]:
    """Wait for the import, then for the test; kill the group at either limit: (the problem,
    "" if in time; the test's stacks at its time limit, judge/hang.py)."""
    def exited(timeout: float) -> bool:
        try:
            proc.wait(timeout=timeout)
            return True
        except subprocess.TimeoutExpired:
            return False
    deadline = time.monotonic() + IMPORT_LIMIT_S
    while not verdict.ready.is_set() and time.monotonic() < deadline:
        if exited(0.05):
            return "", b""
    problem, stacks = "", b""
    if not verdict.ready.is_set():
        problem = (f"importing your module took over {IMPORT_LIMIT_S:g} s; the judge stopped it. "
                   "Code at the top level of your file runs on import: does it wait for something?")
    elif not exited(limit):
        problem = (f"timed out after {limit:.3g} s; the judge stopped it and everything it "
                   "started. ")
        stacks = hang.ask_for_stacks(proc.pid, verdict)
    if problem:
        _kill_group(proc.pid)
        proc.wait()
    return problem, stacks


def _died(spec: api.TestSpec, code: int, step: str | None = None) -> dict:
    why = "a crash in native code, os._exit, or a signal"
    if code in (-signal.SIGKILL, -signal.SIGSEGV, -signal.SIGABRT):
        why += (f"; if your code allocates a lot, it may have run out of memory (the judge "
                f"allows {MEMORY_MIB} MiB per process)")
    return {"name": spec.name, "status": "fail", "kind": "error", "input": step or spec.input,
            "message": f"the test process died with exit code {code} before reporting ({why})"}


def _kill_group(pgid: int) -> None:
    """SIGKILL the test's process group, its resource trackers last (see kill_processes)."""
    members = []
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == pgid:
                members.append(p)
        except (OSError, psutil.Error):
            continue
    kill_processes(members, grace=TRACKER_EXIT_S, first=signal.SIGKILL)
    try:
        os.killpg(pgid, signal.SIGKILL)  # anything that started meanwhile
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
    # What is still alive escaped the test's process: every descendant comes back to the
    # judge (a subreaper), and the environment marker finds the rest.
    # settle stretches with load, as the time limits do: at load 20 on 2 cores a resource
    # tracker whose clients died took over 0.5 s to exit, and read as the learner's leak
    leaks = before.leaks(settle=LEAK_SETTLE_S * time_scale(),
                         extra_processes=_marked_processes(token))
    if leaks.others:
        res["warnings"] = [leaks.warning()]
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
