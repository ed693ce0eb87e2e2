#!/usr/bin/env python3
"""Do the judge's verdicts depend on load? Run self-checks many times while busy processes spin.

    python scripts/judge_stability.py --busy 2 --runs 20 --what solution 101 123
    python scripts/judge_stability.py --busy 2 --runs 5 --what variants --shards 3 201 402

--what solution: the reference solution must pass every run; variants: the solution and every
known-wrong variant must give the verdict judge.py NNN --check wants, every run. Each check is
selfcheck's own (tests/exercise_checks.py runs them --shards at a time). --busy K processes run
`while 1: pass` meanwhile and are killed at the end. Prints, per exercise: runs, the checks
whose verdict changed between runs (or was wrong every time), and the seconds a check took.
--log FILE keeps every check's problem as a JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

from exercise_checks import run_all  # noqa: E402

from minivllm.judge import exercise  # noqa: E402

BUSY_CODE = "while 1: pass"


def start_busy(k: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", BUSY_CODE]) for _ in range(k)]


def stop_busy(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()


def keys_for(number: str, what: str) -> list[tuple[str, str, str]]:
    ex = exercise.find(number)
    keys = [("solution", ex.number, "")]
    if what == "variants":
        keys += [("variant", ex.number, v.name) for v in ex.variants()]
    return keys


def summarize(number: str, keys, rounds: list[tuple[dict, dict]]) -> tuple[str, int]:
    """The exercise's line, and how many of its checks changed or were wrong every run."""
    outcomes, seconds = defaultdict(set), []
    for verdicts, took in rounds:
        for key in keys:
            outcomes[key].add("missing" if key not in verdicts else
                              "ok" if verdicts[key] is None else "BAD")
            seconds += [took[key]] if key in took else []
    changed = [k for k in keys if len(outcomes[k]) > 1]
    wrong = [k for k in keys if "ok" not in outcomes[k] and k not in changed]
    line = (f"{number}: {len(rounds)} runs x {len(keys)} checks; verdicts that changed: "
            f"{len(changed)}; wrong every run: {len(wrong)}; seconds a check: mean "
            f"{statistics.mean(seconds or [0]):.1f}, max {max(seconds or [0]):.1f}")
    for k in changed + wrong:
        line += f"\n    {'changed' if k in changed else 'wrong'}: {k[0]} {k[2]!r}"
    return line, len(changed) + len(wrong)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("numbers", nargs="*", help="exercises (default: all)")
    parser.add_argument("--busy", type=int, default=2, help="busy processes meanwhile")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--what", choices=("solution", "variants"), default="solution")
    parser.add_argument("--shards", type=int, default=1, help="checks run side by side")
    parser.add_argument("--log", help="append every check's result here, one JSON line each")
    args = parser.parse_args(argv)
    numbers = args.numbers or [ex.number for ex in exercise.all_exercises()]
    keys = {n: keys_for(n, args.what) for n in numbers}
    every = [k for n in numbers for k in keys[n]]
    busy = start_busy(args.busy)
    rounds = []
    try:
        for run in range(args.runs):  # a round checks every exercise once: load stays mixed
            took: dict = {}
            verdicts = run_all(every, args.shards, took)
            rounds.append((verdicts, took))
            print(f"run {run + 1} of {args.runs}: {sum(v is not None for v in verdicts.values())}"
                  f" of {len(every)} checks not as declared", flush=True)
            if args.log:
                with open(args.log, "a") as f:
                    for key in every:
                        f.write(json.dumps({"run": run, "key": key, "seconds": took.get(key),
                                            "problem": verdicts.get(key, "missing")}) + "\n")
    finally:
        stop_busy(busy)
    bad = 0
    for n in numbers:
        line, count = summarize(n, keys[n], rounds)
        bad += count
        print(line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
