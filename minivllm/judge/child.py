"""Runs one test of an exercise in this (child) process and reports its result as JSON.

    python -m minivllm.judge.child TESTS_PY IMPL_DIR MODULE TEST_NAME

The first line of stdin is the number of the file descriptor to report to: a pipe the judge
holds, named nowhere the learner's module looks (argv, env). The child writes "ready" there
once the tests and the learner's module are imported (the test's time limit starts then, so a
slow import on a busy machine never eats it), a line `step "..."` for each api.step the test
takes, then the result as one JSON line.
IMPL_DIR holds the code under test as MODULE.py and is on sys.path (and PYTHONPATH), so
that processes the learner's code spawns can import it by name too.
"""

from __future__ import annotations

import faulthandler
import importlib
import importlib.util
import json
import os
import resource
import sys
import time
import traceback

from minivllm.judge import api, hang
from minivllm.utils.resource_names import name_default_segments


def load_tests(tests_path: str):
    spec = importlib.util.spec_from_file_location("exercise_tests", tests_path)
    module = importlib.util.module_from_spec(spec)
    api.REGISTRY.clear()
    spec.loader.exec_module(module)
    return module, list(api.REGISTRY)


class _ForkedChildReturned(Exception):
    """A process the learner's code forked came back into the test's code."""


def _escaped_fork(exc: BaseException) -> str:
    """The message for a process the learner's code forked that left its branch of os.fork()
    (by an exception or by returning) and so went on into the judge's code."""
    how = ("returned" if isinstance(exc, _ForkedChildReturned)
           else f"let {type(exc).__name__}: {exc} escape")
    return (f"a process your code forked (pid {os.getpid()}) {how} out of its branch of "
            "os.fork() and ran on into the judge's code: the child must leave with os._exit(code), "
            "in a finally around its work (os._exit(0) on success, 1 on an error), never by "
            "returning or raising")


def _failed_input(given: str | None, tb, impl_dir: str, spec: api.TestSpec) -> str:
    """The failure's `input:` line: the input it was given; for a crash, the call into the
    learner's code that raised, unless the test's last step names that function (it says
    more); else the last step; else the test's whole input."""
    if given is not None:
        return given
    call = api.call_in_traceback(tb, impl_dir) if tb is not None else ""
    return api.failed_input(api.current_step(), call, spec.input)


def run(tests_path: str, impl_dir: str, module_name: str, test_name: str,
        ready=lambda: None) -> dict:
    sys.path.insert(0, impl_dir)
    api._steps.clear()
    _, specs = load_tests(tests_path)
    spec = next(s for s in specs if s.name == test_name)
    start = time.perf_counter()
    result = {"name": test_name, "status": "pass", "message": "", "input": spec.input}
    test_pid = os.getpid()
    try:
        impl = importlib.import_module(module_name)
        ready()
        start = time.perf_counter()
        note = spec.fn(impl)
        if os.getpid() != test_pid:
            raise _ForkedChildReturned()
        if isinstance(note, str):  # a passing test may say what it checked
            result["note"] = note
    except api.Fail as exc:
        result.update(status="fail", message=exc.message, expected=exc.expected, got=exc.got,
                      differs=exc.differs, detail=exc.detail, input=_failed_input(exc.input, None, impl_dir, spec))
    except MemoryError:
        result.update(status="fail", kind="error",
                      message="your code ran out of memory: the judge allows each process "
                              f"{os.environ.get('MINIVLLM_JUDGE_MEMORY_MIB', '?')} MiB of address "
                              "space. Look for a buffer that grows without bound.")
    except NotImplementedError:
        where = api.learner_frame(sys.exc_info()[2], impl_dir)
        result["input"] = _failed_input(None, sys.exc_info()[2], impl_dir, spec)
        result.update(status="fail", kind="todo",
                      message=f"not implemented yet: {where or 'a TODO'} raises NotImplementedError")
    except BaseException as exc:  # the learner's code crashed: show where
        where = api.learner_frame(exc.__traceback__, impl_dir)
        tb = "".join(traceback.format_exception(exc, limit=-4))
        raised = f"your code raised {type(exc).__name__}: {exc}"
        if os.getpid() != test_pid:
            raised = _escaped_fork(exc)
        result["input"] = _failed_input(None, exc.__traceback__, impl_dir, spec)
        result.update(status="fail", kind="error",
                      message=raised + (f"\n  in {where}" if where else ""), detail=tb)
    result["seconds"] = round(time.perf_counter() - start, 3)
    return result


def main(argv: list[str]) -> int:
    fd = int(sys.stdin.readline())
    sys.stdin = open(os.devnull)
    return serve(fd, argv)


def serve(fd: int, argv: list[str]) -> int:
    """Run the test and write its verdict to fd (also how minivllm.judge.zygote's forks run)."""
    tests_path, impl_dir, module_name, test_name = argv
    os.set_inheritable(fd, False)  # processes the learner's code execs never hold it
    name_default_segments()  # unnamed SharedMemory segments carry the judge's prefix
    limit = int(os.environ.get("MINIVLLM_JUDGE_MEMORY_MIB", 0)) << 20
    if limit:  # address space, for this process and all it starts
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    # each step goes to the judge as it is taken, and on the judge's signal the stacks: a
    # hang's input line names the last step, or the learner's call it hung in (judge/hang.py)
    api._step_sink.append(lambda text: os.write(fd, b"step " + json.dumps(text).encode() + b"\n"))
    faulthandler.register(hang.STACK_SIGNAL, file=open(fd, "w", closefd=False), all_threads=True)
    result = run(tests_path, impl_dir, module_name, test_name,
                 ready=lambda: os.write(fd, b"ready\n"))
    try:
        with open(fd, "w") as f:
            f.write(json.dumps(result) + "\n")
    except BrokenPipeError:  # the judge took a verdict already: one from a process the code forked
        pass
    return 0


if __name__ == "__main__":
    sys.stdout.reconfigure(line_buffering=True)
    sys.exit(main(sys.argv[1:]))
