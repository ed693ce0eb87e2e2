#!/usr/bin/env python3
"""The judge for practice/ exercises.

    python judge.py                 list the exercises and your progress
    python judge.py 213             grade your practice/213_*/ starter file
    python judge.py 213 --file F    grade your answer kept in F (anywhere); counts as progress too
    python judge.py 213 --solution  grade the reference answer in solutions/
    python judge.py 213 --hint      show the hint
    python judge.py 213 --watch     regrade on every save
    python judge.py 213 --json out.json
    python judge.py 213 --check     (authors) solution passes, starter and variants fail
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
VENV_PYTHON = HERE / ".venv" / "bin" / "python"
SETUP = "bash scripts/setup.sh"


def _use_the_venv() -> None:
    """Started with another Python (no psutil, zmq...)? Run again with the project's .venv."""
    try:
        import msgspec, psutil, zmq  # noqa: F401, E401
        return
    except ImportError as exc:
        missing = exc.name
    if VENV_PYTHON.exists() and Path(sys.prefix).resolve() != (HERE / ".venv").resolve():
        os.execv(str(VENV_PYTHON), [str(VENV_PYTHON), str(HERE / "judge.py"), *sys.argv[1:]])
    sys.exit(f"judge.py: this Python lacks {missing}; set the project up once with `{SETUP}` "
             f"(it makes .venv), then run `.venv/bin/python judge.py ...`")


_use_the_venv()
sys.path.insert(0, str(HERE))

from minivllm.judge import exercise, report, runner, selfcheck  # noqa: E402

# Your progress; MINIVLLM_JUDGE_PROGRESS points elsewhere (the test suite uses that).
PROGRESS = Path(os.environ.get("MINIVLLM_JUDGE_PROGRESS", HERE / ".judge_progress.json"))
WATCH_POLL_S = 0.5


def load_progress() -> dict:
    try:
        return json.loads(PROGRESS.read_text())
    except (OSError, ValueError):
        return {}


PASSED, FAILING, PASSED_LAST_FAILING = "passed", "failing", "passed; last failing"


def save_progress(number: str, passed: bool) -> None:
    """Your grade of `number` (the starter or a --file), for the listing: once passed, it stays
    passed; a later failing grade (a broken copy, an experiment) only shows as the last one."""
    progress = load_progress()
    ever_passed = str(progress.get(number, "")).startswith(PASSED)
    progress[number] = PASSED if passed else PASSED_LAST_FAILING if ever_passed else FAILING
    try:
        PROGRESS.write_text(json.dumps(progress, indent=1, sort_keys=True))
    except OSError as e:  # a read-only checkout: the grade stands, only the listing misses it
        print(f"judge.py: could not record your progress in {PROGRESS}: {e.strerror}",
              file=sys.stderr)


def list_exercises() -> int:
    progress = load_progress()
    rows = exercise.all_exercises()
    statuses = {ex.number: str(progress.get(ex.number, "not tried")) for ex in rows}
    width = max(len("status"), *map(len, statuses.values()))
    print(f"{'#':<4} {'chapter':<8} {'status':<{width}} title")
    for ex in rows:
        need = f"  [needs {', '.join(ex.requires)}]" if ex.requires else ""
        print(f"{ex.number:<4} {ex.chapter:<8} {statuses[ex.number]:<{width}} {ex.title}{need}")
    done = sum(status.startswith(PASSED) for status in statuses.values())
    print(f"\n{done} of {len(rows)} passed. Grade one with: python judge.py NNN "
          f"(your answer elsewhere: python judge.py NNN --file my_answer.py)")
    return 0


def grade_once(ex: exercise.Exercise, path: Path, args) -> bool:
    g = runner.grade(ex, path, first=tuple(args.first))
    print(report.format_grade(g))
    if args.json:
        Path(args.json).write_text(json.dumps(g.to_json(), indent=2))
    if path.resolve() != ex.solution.resolve():  # your answer: the starter, or a --file
        save_progress(ex.number, g.passed)
    return g.passed


def watch(ex: exercise.Exercise, path: Path, args) -> int:
    print(f"watching {path}; save it to regrade, Ctrl-C to stop\n")
    last = None
    try:
        while True:
            stamp = path.stat().st_mtime_ns
            if stamp != last:
                last = stamp
                print("\033[2J\033[H" if sys.stdout.isatty() else "", end="")
                grade_once(ex, path, args)
            time.sleep(WATCH_POLL_S)
    except KeyboardInterrupt:
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Grade the practice/ exercises.")
    parser.add_argument("number", nargs="?", help="exercise number, e.g. 213")
    parser.add_argument("--solution", action="store_true", help="grade the reference solution")
    parser.add_argument("--file", help="grade this file instead of the starter")
    parser.add_argument("--hint", action="store_true", help="print the hint")
    parser.add_argument("--watch", action="store_true", help="regrade on every save")
    parser.add_argument("--json", metavar="FILE", help="write the results as JSON")
    parser.add_argument("--check", action="store_true",
                        help="authors: the solution passes, the starter and every variant fail")
    parser.add_argument("--first", action="append", default=[], metavar="TEST",
                        help="authors: run this test before the others (repeatable)")
    parser.add_argument("--in-engine", action="store_true",
                        help="213 only: run your ring under a TP=3 engine (minivllm/judge/in_engine.py)")
    args = parser.parse_args(argv)
    if args.number is None:
        return list_exercises()
    ex = exercise.find(args.number)
    if args.hint:
        print(ex.hint())
        return 0
    if args.check:
        print(f"self-check of exercise {ex.number}: {ex.title}")
        return 1 if selfcheck.check_all(ex) else 0
    path = Path(args.file) if args.file else ex.solution if args.solution else ex.starter
    if not path.is_file():
        parser.exit(2, f"judge.py: {path} is not a file; --file takes the path of a Python file "
                       f"with the interface of {ex.starter.name}\n")
    if args.json and not Path(args.json).resolve().parent.is_dir():
        parser.exit(2, f"judge.py: cannot write --json {args.json}: the folder "
                       f"{Path(args.json).resolve().parent} does not exist\n")
    if args.in_engine:
        if ex.number != "213":
            parser.exit(2, "judge.py: --in-engine grades exercise 213's ring buffer only\n")
        from minivllm.judge import in_engine
        return 0 if in_engine.grade(str(path)) else 1
    if args.watch:
        return watch(ex, path, args)
    try:
        return 0 if grade_once(ex, path, args) else 1
    except runner.UnknownTest as e:
        parser.exit(2, f"judge.py: {e}\n")


def run_quietly_on_a_closed_pipe() -> int:
    """main(), but a reader that stops early (`python judge.py | head`) ends it quietly."""
    try:
        code = main()
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        # Python flushes stdout again at exit: point it at /dev/null so that flush succeeds.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(run_quietly_on_a_closed_pipe())
