"""The judge's own machinery, on small exercises made here: time limits, the sweep for leftovers,
capabilities, and the command line on exercise 213."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

import psutil
import pytest

from minivllm.judge import exercise
from minivllm.judge.exercise import Exercise
from minivllm.judge.interleave import InstrumentedBuffer, Violation, explore
from minivllm.judge.runner import grade

ROOT = Path(__file__).resolve().parent.parent

TESTS = '''
from minivllm.judge.api import Fail, test

@test(input="a learner function that never returns", timeout=3, hang="it spins forever")
def hangs(impl):
    impl.hang()

@test(input="leaves things behind")
def leaks(impl):
    impl.leak()

@test(input="double fork, setsid, exec with an empty environment")
def escapes(impl):
    impl.escape()

@test(input="50 MB on one line")
def floods(impl):
    impl.flood()

@test(input="a 64 GiB buffer")
def hogs(impl):
    impl.hog()

@test(requires=("no-such-capability",))
def needs_capability(impl):
    raise Fail("must never run")
'''

LEARNER = '''
import os, socket, subprocess, sys, tempfile, time
from multiprocessing import shared_memory

def hang():
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    while True:
        time.sleep(0.01)

def leak():
    shm = shared_memory.SharedMemory(create=True, size=4096)
    shm.close()
    from multiprocessing import resource_tracker
    resource_tracker.unregister(shm._name, "shared_memory")  # so that only the judge can find it
    s = socket.socket(socket.AF_UNIX)
    s.bind(os.path.join(tempfile.mkdtemp(), "left.sock"))
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)

def escape():
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.execve("/bin/sleep", ["sleep", "77"], {})
        os._exit(0)
    os.wait()

def flood():
    sys.stdout.write("x" * 50_000_000 + "\\n")
    raise ValueError("after the flood")

def hog():
    return bytearray(64 << 30)

def tidy():
    for _ in range(20):
        shm = shared_memory.SharedMemory(create=True, size=4096)
        shm.close()
        shm.unlink()
        path = os.path.join(tempfile.mkdtemp(), "s.sock")
        s = socket.socket(socket.AF_UNIX)
        s.bind(path)
        s.close()
        os.unlink(path)
        time.sleep(0.02)
'''


def make_exercise(tmp_path: Path, requires=()) -> Exercise:
    (tmp_path / "tests.py").write_text(textwrap.dedent(TESTS))
    (tmp_path / "learner.py").write_text(textwrap.dedent(LEARNER))
    return Exercise("999", tmp_path, "judge self-test", "00", "learner.py", tuple(requires))


def by_name(g):
    return {r["name"]: r for r in g.results}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """The self-test exercise graded once, every test run (its results, by name)."""
    ex = make_exercise(tmp_path_factory.mktemp("ex"))
    old = os.environ.get("MINIVLLM_JUDGE_TIME_SCALE")
    os.environ["MINIVLLM_JUDGE_TIME_SCALE"] = "1"  # limits not stretched by this machine's load
    try:
        return by_name(grade(ex, ex.starter, stop_at_first_failure=False))
    finally:
        if old is None:
            del os.environ["MINIVLLM_JUDGE_TIME_SCALE"]
        else:
            os.environ["MINIVLLM_JUDGE_TIME_SCALE"] = old


def test_timeout_kills_the_group_and_explains(graded):
    hang = graded["hangs"]
    assert hang["status"] == "fail" and hang["kind"] == "timeout"
    assert "timed out after 3 s" in hang["message"] and "it spins forever" in hang["message"]


def test_leftovers_are_removed_and_reported(graded):
    leak = graded["leaks"]
    assert leak["status"] == "fail" and leak["kind"] == "leak"
    assert "left a shared-memory segment" in leak["message"]
    assert "left an ipc socket file" in leak["message"]
    assert "left a process running" in leak["message"]  # it escaped the group with setsid


def test_an_escape_by_setsid_and_exec_is_a_leak_and_is_killed(graded):
    r = graded["escapes"]
    assert r["status"] == "fail" and r["kind"] == "leak" and "sleep 77" in r["message"], r
    pid = int(re.search(r"pid (\d+) \(sleep 77", r["message"]).group(1))
    assert not psutil.pid_exists(pid)


def test_output_is_clipped_by_bytes_and_memory_is_limited(graded):
    flood = graded["floods"]
    assert "after the flood" in flood["message"] and len(flood["output"]) < 5000
    assert "50,000,001 bytes in all" in flood["output"]
    hog = graded["hogs"]
    assert hog["kind"] == "error" and "ran out of memory" in hog["message"], hog


def test_missing_capability_is_skip_never_pass(graded, tmp_path):
    assert graded["needs_capability"]["status"] == "skip"
    ex_all = make_exercise(tmp_path, requires=("no-such-capability",))
    g_all = grade(ex_all, ex_all.starter)
    assert {r["status"] for r in g_all.results} == {"skip"} and not g_all.passed


def run_judge(*args, progress_dir=None):
    env = dict(os.environ, MINIVLLM_JUDGE_PROGRESS=str(Path(progress_dir or "/nonexistent") / "p.json"))
    return subprocess.run([sys.executable, "judge.py", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env=env)


def test_cli_lists_and_grades_213(tmp_path):
    listing = run_judge()
    assert listing.returncode == 0 and "213" in listing.stdout and "Shared-memory" in listing.stdout
    starter = run_judge("213", "--json", str(tmp_path / "r.json"), progress_dir=tmp_path)
    assert json.loads((tmp_path / "p.json").read_text()) == {"213": "failing"}
    assert starter.returncode != 0 and "not implemented yet" in starter.stdout
    record = json.loads((tmp_path / "r.json").read_text())
    assert record["passed"] is False and record["tests"][0]["status"] == "fail"
    assert run_judge("213", "--hint").stdout.strip()


def test_flag_order_bug_prints_the_breaking_schedule(tmp_path):
    ex = exercise.find("213")
    variant = next(v for v in ex.variants() if "before the read flags" in v.name)
    wrong = tmp_path / "ring_buffer.py"
    wrong.write_text(variant.apply(ex.solution.read_text()))
    out = run_judge("213", "--file", str(wrong))
    assert out.returncode == 1
    assert "The schedule that breaks it, step by step" in out.stdout
    assert "store buf[16] = 1   (chunk 0 written flag)" in out.stdout
    assert "received b'm0' as message 2" in out.stdout


def test_213_timeline_names_every_byte_a_multi_byte_access_touches():
    from minivllm.judge.child import load_tests
    tests, _ = load_tests(str(exercise.find("213").tests))
    label = tests.label_for(2, 2, 8)  # chunks at 0 and 8, meta rows of 3 bytes at 16 and 19
    assert label(17, 19) == "chunk 0 read flags of readers 0-1"
    assert label(16, 19) == "chunk 0 written flag and read flags of readers 0-1"
    assert label(18, 19) == label(18) == "chunk 0 read flag of reader 1"
    assert label(8, 12) == "chunk 1 length header" and label(12, 15) == "chunk 1 payload"


def test_cli_says_in_one_line_what_is_wrong_with_its_arguments(tmp_path):
    missing = run_judge("213", "--file", str(tmp_path / "nope.py"))
    assert missing.returncode == 2 and "nope.py is not a file" in missing.stderr
    assert "Traceback" not in missing.stderr and len(missing.stderr.strip().splitlines()) == 1
    folder = run_judge("213", "--solution", "--json", str(tmp_path / "no" / "r.json"))
    assert folder.returncode == 2 and "does not exist" in folder.stderr
    assert "Traceback" not in folder.stderr


def test_first_runs_the_named_tests_first_and_refuses_a_name_it_lacks(tmp_path):
    """The mutation sweep's --first-from passes a mutant's earlier killer to the judge."""
    from minivllm.judge.child import load_tests
    ran = run_judge("102", "--solution", "--first", "rejects_bad_sizes", "--first", "docs_examples",
                    "--json", str(tmp_path / "r.json"))
    names = [t["name"] for t in json.loads((tmp_path / "r.json").read_text())["tests"]]
    assert ran.returncode == 0 and names[:2] == ["docs_examples", "rejects_bad_sizes"], names
    assert sorted(names) == sorted(s.name for s in load_tests(str(exercise.find("102").tests))[1])
    wrong = run_judge("102", "--solution", "--first", "no_such_test")
    assert wrong.returncode == 2 and "no test named ['no_such_test']" in wrong.stderr
    assert "Traceback" not in wrong.stderr
def test_cli_started_with_another_python_runs_with_the_venv():
    """A Python without the project's packages (python -I -S: no site-packages) re-executes
    judge.py with .venv's interpreter, or says in one line how to set it up."""
    out = subprocess.run([sys.executable, "-I", "-S", "judge.py"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    if (ROOT / ".venv" / "bin" / "python").exists():
        assert out.returncode == 0 and "213" in out.stdout, out.stderr
    else:
        assert out.returncode != 0 and "scripts/setup.sh" in out.stderr


TIDY_TEST = """
from minivllm.judge.api import test

@test(input="segments and sockets, made and removed")
def tidy(impl):
    impl.tidy()
"""

OTHER_PROGRAM = """
import os, secrets, socket, sys, time
from multiprocessing import resource_tracker, shared_memory
made = []
while not os.path.exists(sys.argv[1]):
    for name in ("minivllm-ring-" + secrets.token_hex(6), None):  # minivllm's look, and psm_
        shm = shared_memory.SharedMemory(name=name, create=True, size=4096)
        resource_tracker.unregister(shm._name, "shared_memory")
        shm.close()
        made.append("/dev/shm/" + shm.name.lstrip("/"))
    path = os.path.join(sys.argv[2], "minivllm-other-" + secrets.token_hex(6))
    s = socket.socket(socket.AF_UNIX)
    s.bind(path)
    s.close()
    made.append(path)
    time.sleep(0.02)
print(" ".join(made))
"""


def test_another_programs_files_are_never_blamed_or_deleted(tmp_path):
    """Another program (outside the judge's process tree) makes /dev/shm segments and
    /tmp/minivllm-* sockets all through a grade: the grade passes and its files all stay."""
    stop, shared_tmp = tmp_path / "stop", os.path.dirname(tempfile.gettempdir())
    other = subprocess.Popen([sys.executable, "-c", OTHER_PROGRAM, str(stop), shared_tmp],
                             stdout=subprocess.PIPE, text=True)
    (tmp_path / "tests.py").write_text(TIDY_TEST)
    (tmp_path / "learner.py").write_text(textwrap.dedent(LEARNER))
    code = ("import sys, json; from pathlib import Path; from minivllm.judge.exercise import Exercise;"
            "from minivllm.judge.runner import grade; d = Path(sys.argv[1]);"
            "g = grade(Exercise('999', d, 't', '00', 'learner.py', ()), d / 'learner.py', False);"
            "print(json.dumps([r for r in g.results if r['name'] == 'tidy']))")
    try:
        out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                             text=True, timeout=300, cwd=ROOT)
    finally:
        stop.touch()
        made = other.communicate(timeout=60)[0].split()
    try:
        (tidy,) = json.loads(out.stdout.strip().splitlines()[-1])
        assert tidy["status"] == "pass", tidy
        assert len(made) > 10 and [p for p in made if not os.path.exists(p)] == []
    finally:
        for path in made:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass


def _counter_search(bound: int, max_runs: int = 10_000):
    """Two threads each add 1 to a shared byte twice, by a load and a separate store."""
    shared = []

    def make_bodies():
        shared[:] = [InstrumentedBuffer(1)]

        def body(ctx):
            buf = shared[0].bind(ctx)
            for _ in range(2):
                buf[0] = buf[0] + 1
        return [body, body]

    def final_check():
        if shared[0].data[0] != 4:
            raise Violation(f"the counter is {shared[0].data[0]}, expected 4 (a lost update)")
    return explore(["a", "b"], make_bodies, final_check, preemption_bound=bound, max_runs=max_runs)


def test_the_search_is_bounded_by_schedules_and_deterministic():
    clean = _counter_search(bound=0)
    assert clean.finished and clean.failure is None  # no preemption: no lost update
    found = _counter_search(bound=1)
    assert found.failure and "lost update" in found.failure.failure
    assert _counter_search(bound=1).runs == found.runs  # the same schedule, found the same way
    budget = _counter_search(bound=0, max_runs=1)  # a correct run, then the budget is spent
    assert budget.runs == 1 and budget.failure is None
    unfinished = _counter_search(bound=2, max_runs=1)
    assert unfinished.runs == 1 and not unfinished.finished and unfinished.failure is None


def _with_canary(canary: str) -> list[tuple[int, str]]:
    """(pid, state) of every process whose environment holds canary."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if canary.encode() not in f.read():
                    continue
            with open(f"/proc/{pid}/stat") as f:
                found.append((int(pid), f.read().rsplit(")", 1)[1].split()[0]))
        except OSError:
            continue
    return found


def test_a_judge_stopped_by_sigterm_kills_the_test_it_was_running(tmp_path):
    """Tests run in sessions of their own; a SIGTERM to the judge (a CI timeout, `kill`) once
    left the test running, or stopped for good where the test had stopped a process."""
    learner = tmp_path / "process_count.py"
    learner.write_text("import os, signal\n\ndef serve_process_count(tp, dp, pp=1, "
                       "api_server_count=None):\n    os.kill(os.getpid(), signal.SIGSTOP)\n")
    canary = f"judge-canary-{uuid.uuid4().hex}"
    judge = subprocess.Popen([sys.executable, "judge.py", "102", "--file", str(learner)], cwd=ROOT,
                             env=dict(os.environ, JUDGE_CANARY=canary),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not any(state == "T" for _, state in _with_canary(canary)):
            assert judge.poll() is None and time.monotonic() < deadline, "no test stopped itself"
            time.sleep(0.05)
        judge.terminate()
        assert judge.wait(timeout=30) == 128 + signal.SIGTERM
        deadline = time.monotonic() + 10
        while _with_canary(canary) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _with_canary(canary), "processes of the judge's run outlived it"
    finally:
        for pid, _ in _with_canary(canary):
            os.kill(pid, signal.SIGKILL)
        judge.kill()
        judge.wait()


def test_a_judge_killed_outright_takes_its_running_test_with_it(tmp_path):
    """SIGKILL runs no cleanup in the judge: the zygote that forked the test sees the judge's end
    of their socket close and kills the test's session. The same path covers a SIGTERM that lands
    between asking the zygote for a fork and learning the new test's pid (once seen in CI)."""
    learner = tmp_path / "process_count.py"
    learner.write_text("import os, signal\n\ndef serve_process_count(tp, dp, pp=1, "
                       "api_server_count=None):\n    os.kill(os.getpid(), signal.SIGSTOP)\n")
    canary = f"judge-canary-{uuid.uuid4().hex}"
    work_root = tempfile.mkdtemp(prefix="jk", dir="/tmp")  # short: the judge keeps it
    judge = subprocess.Popen([sys.executable, "judge.py", "102", "--file", str(learner)], cwd=ROOT,
                             env=dict(os.environ, JUDGE_CANARY=canary, TMPDIR=work_root),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not any(state == "T" for _, state in _with_canary(canary)):
            assert judge.poll() is None and time.monotonic() < deadline, "no test stopped itself"
            time.sleep(0.05)
        judge.kill()
        judge.wait()
        deadline = time.monotonic() + 10
        while _with_canary(canary) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _with_canary(canary), "the killed judge's test (or zygote) outlived it"
    finally:
        for pid, _ in _with_canary(canary):
            os.kill(pid, signal.SIGKILL)
        judge.kill()
        judge.wait()
        shutil.rmtree(work_root, ignore_errors=True)
