"""A failure's `input:` line names the call that failed (a test that makes several calls says
which with api.step; with no step, a crash is named from its traceback and a hang from the
test's stacks at its time limit), and a pass graded with --file counts in the listing."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from minivllm.judge import exercise
from minivllm.judge.exercise import Exercise
from minivllm.judge.runner import grade

ROOT = Path(__file__).resolve().parent.parent

TESTS = '''
from minivllm.judge.api import Fail, step, test

@test(input="the whole test: first(1), then second(2, label='x')")
def crash_without_step(impl):
    impl.first(1)
    impl.second(2, label="x")

@test(input="the whole test")
def crash_in_a_constructor(impl):
    impl.Thing(5)

@test(input="the whole test: first(1), then triple(2)")
def fail_after_step(impl):
    step("first(1)")
    impl.first(1)
    step("triple(2)")
    if impl.triple(2) != 6:
        raise Fail("triple(2) is wrong")

@test(input="the whole test")
def crash_in_the_stepped_call(impl):
    step("second(7), after the judge set things up")
    impl.second(7)

@test(input="the whole test")
def crash_elsewhere_than_the_step(impl):
    step("first(1)")
    impl.first(1)
    impl.second(3)

@test(input="the whole test: first(1), then hang(3)", timeout=2)
def hang_without_step(impl):
    impl.first(1)
    impl.hang(3)

@test(input="the whole test: first(1), then hang(3)", timeout=2)
def hang_after_step(impl):
    step("first(1)")
    impl.first(1)
    step("hang(3), a call that never returns")
    impl.hang(3)
'''

LEARNER = '''
import time

def first(x):
    return x

def second(x, label=None):
    raise OSError("handle is closed")

def triple(x):
    return x * 2

def hang(x):
    return spin()

def spin():
    while True:
        time.sleep(0.01)

class Thing:
    def __init__(self, n):
        raise ValueError("no thing")
'''


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """The self-test exercise graded once, every test run: each failure's input line."""
    folder = tmp_path_factory.mktemp("ex")
    (folder / "tests.py").write_text(textwrap.dedent(TESTS))
    (folder / "learner.py").write_text(textwrap.dedent(LEARNER))
    ex = Exercise("998", folder, "input lines", "00", "learner.py", ())
    old = os.environ.get("MINIVLLM_JUDGE_TIME_SCALE")
    os.environ["MINIVLLM_JUDGE_TIME_SCALE"] = "1"  # the hang is stopped at its own limit
    try:
        g = grade(ex, ex.starter, stop_at_first_failure=False)
    finally:
        if old is None:
            del os.environ["MINIVLLM_JUDGE_TIME_SCALE"]
        else:
            os.environ["MINIVLLM_JUDGE_TIME_SCALE"] = old
    assert all(r["status"] == "fail" for r in g.results), g.results
    return {r["name"]: r["input"] for r in g.results}


def test_a_crash_is_named_by_the_call_that_raised(inputs):
    assert inputs["crash_without_step"] == "second(x=2, label='x')"
    assert inputs["crash_in_a_constructor"] == "Thing(n=5)"
    # the step names another function: the call that raised wins
    assert inputs["crash_elsewhere_than_the_step"] == "second(x=3, label=None)"


def test_a_step_names_the_call_for_a_wrong_result_a_crash_in_it_and_a_hang(inputs):
    assert inputs["fail_after_step"] == "triple(2)"
    assert inputs["crash_in_the_stepped_call"] == "second(7), after the judge set things up"
    assert inputs["hang_after_step"] == "hang(3), a call that never returns"


def test_a_hang_with_no_step_is_named_by_the_learners_call_it_was_in(inputs):
    """The judge asks the test for its stacks before it stops it: the outermost frame of the
    learner's file (hang, which called spin) is the call that hung."""
    assert inputs["hang_without_step"] == ("hang(...), still running at line 14 of your file "
                                          "when the judge stopped the test")


SOLUTION_ENTRY = '''
    try:
        result = target(*args)
    except Exception as e:
        conn.send(("error", f"{type(e).__name__}: {e}"))
        return
    conn.send(("ready", result))
'''
# the same entry, closing conn after the send (the README allows it: conn is the worker's)
CLOSES_CONN = ("\n    try:" + textwrap.indent(SOLUTION_ENTRY, "    ")
               + "    finally:\n        conn.close()\n")


def answer_101(tmp_path: Path, entry: str) -> Path:
    source = exercise.find("101").solution.read_text()
    assert SOLUTION_ENTRY in source, "101's reference worker_entry changed: update this test"
    path = tmp_path / "my_answer.py"
    path.write_text(source.replace(SOLUTION_ENTRY, entry))
    return path


def judge(*args: str, progress: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "judge.py", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600,
                          env=dict(os.environ, MINIVLLM_JUDGE_PROGRESS=str(progress)))


def test_101_a_worker_entry_that_closes_conn_passes_and_its_pass_with_file_is_listed(tmp_path):
    """101's README lets worker_entry close conn after its send: each call the judge makes gets
    a pipe of its own. The pass, graded with --file, shows in the listing."""
    progress = tmp_path / "progress.json"
    run = judge("101", "--file", str(answer_101(tmp_path, CLOSES_CONN)), progress=progress)
    assert run.returncode == 0 and "All tests passed." in run.stdout, run.stdout[-3000:]
    assert json.loads(progress.read_text()) == {"101": "passed"}
    listing = judge(progress=progress)
    assert "1 of 22 passed" in listing.stdout and "101  01       passed" in listing.stdout, \
        listing.stdout
    judge("101", "--solution", progress=progress)  # the reference answer is not yours
    judge("101", "--file", str(exercise.find("101").solution), progress=progress)
    assert json.loads(progress.read_text()) == {"101": "passed"}


def test_101_a_crash_in_worker_entry_names_worker_entry(tmp_path):
    """worker_entry that fails once it has sent (in the judge's own call of it): the input
    line names that call, not the test's first call, start_worker(setup_ok, (21,))."""
    crashes = SOLUTION_ENTRY + "    conn.send_bytes(None)  # a bug after the send\n"
    run = judge("101", "--file", str(answer_101(tmp_path, crashes)),
                progress=tmp_path / "progress.json")
    assert "First failure: ready_handshake (crashed)" in run.stdout, run.stdout[-3000:]
    line = next(ln for ln in run.stdout.splitlines() if ln.strip().startswith("input:"))
    assert "worker_entry(conn, setup_ok, (21,))" in line, run.stdout[-3000:]


def test_every_starter_check_wants_its_crash_named_by_a_function_of_the_starter():
    """--check (and tests/test_exercises.py's starter check, for all 22 exercises): the
    starter's first failure, raised in its code, names one of its functions on the input line."""
    from minivllm.judge.selfcheck import unnamed_call
    ex = exercise.find("101")
    assert unnamed_call(ex, {"name": "t", "input": "worker_entry(conn=<Connection>)"}) is None
    assert "names no function of launcher.py" in unnamed_call(
        ex, {"name": "t", "input": "a child that ignores SIGTERM, timeout=1"})
