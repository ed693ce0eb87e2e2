#!/usr/bin/env python3
"""How long a learner waits for each known-wrong answer to fail: grade every variant of
variants.toml with the judge and print the time to its first failure, slowest first.

    python scripts/first_failure.py                    every exercise, one variant at a time
    python scripts/first_failure.py 411 422 --over 15  only these; flag those over 15 s

A benchmark, not a test: the seconds depend on the machine and its load. Per variant: the
wall time of `judge.py NNN --file VARIANT` (the judge stops at the first failing test, so this
is what the learner waits), the tests' own seconds up to the failing one, the first failing
test and whether it is the one the variant declares. The exit status is 1 when a variant took
longer than --over, passed, or failed first in another test than it declares.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import mutation_score  # noqa: E402  (the judge runner: a session per grade, stopped cleanly)
from mutation_score import exercise  # noqa: E402


def grade_variant(ex: exercise.Exercise, variant, limit: float) -> dict:
    """{"variant", "declared", "failed", "wall_s", "tests_s", "verdict"} of one variant."""
    with tempfile.TemporaryDirectory(prefix=f"variant-{ex.number}-") as tmp:
        path = Path(tmp) / ex.file
        path.write_text(variant.apply(ex.solution.read_text()))
        out = Path(tmp) / "grade.json"
        start = time.monotonic()
        res = mutation_score._judge(ex, path, limit, out, None)
        wall = time.monotonic() - start
        tests = json.loads(out.read_text())["tests"] if out.exists() else []
    ran = []
    for t in tests:
        ran.append(t)
        if t["status"] == "fail":
            break
    return {"exercise": ex.number, "variant": variant.name, "declared": variant.test,
            "failed": res.get("failed", ""), "verdict": res["verdict"],
            "wall_s": round(wall, 1), "tests_s": round(sum(t.get("seconds", 0) for t in ran), 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("numbers", nargs="*", help="exercise numbers (default: all)")
    parser.add_argument("--over", type=float, default=15.0, metavar="S",
                        help="flag a variant whose first failure took longer (default 15)")
    parser.add_argument("--time-limit", type=float, default=300.0, metavar="S",
                        help="give up on one grade after this long (default 300)")
    parser.add_argument("--json", metavar="FILE", help="write every row as JSON")
    args = parser.parse_args(argv)
    exercises = ([exercise.find(n) for n in args.numbers] if args.numbers
                 else exercise.all_exercises())
    rows = []
    try:
        for ex in exercises:
            for variant in ex.variants():
                rows.append(grade_variant(ex, variant, args.time_limit))
                r = rows[-1]
                print(f"{r['exercise']} {r['wall_s']:6.1f} s  {r['failed'] or r['verdict']:<32} "
                      f"{r['variant'][:70]}", file=sys.stderr, flush=True)
    finally:
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))
        print(report(rows, args.over))
    return 1 if any(_bad(r, args.over) for r in rows) else 0


def _failed(r: dict) -> bool:
    return r["verdict"] in ("killed", "timeout")  # "timeout": the failing test hung


def _bad(r: dict, over: float) -> bool:
    return r["wall_s"] > over or not _failed(r) or r["failed"] != r["declared"]


def report(rows: list[dict], over: float) -> str:
    lines = [f"{'ex':<4} {'wall s':>6} {'tests s':>7}  {'first failure':<32} variant"]
    for r in sorted(rows, key=lambda r: -r["wall_s"]):
        mark = ""
        if not _failed(r):
            mark = f"  <- {r['verdict'].upper()}"
        elif r["failed"] != r["declared"]:
            mark = f"  <- declared {r['declared']}"
        elif r["wall_s"] > over:
            mark = f"  <- over {over:g} s"
        lines.append(f"{r['exercise']:<4} {r['wall_s']:>6} {r['tests_s']:>7}  "
                     f"{r['failed'] or '-':<32} {r['variant']}{mark}")
    slow = sum(r["wall_s"] > over for r in rows)
    median = sorted(r["wall_s"] for r in rows)[len(rows) // 2] if rows else 0
    lines.append(f"{len(rows)} variants; {slow} took over {over:g} s to their first failure; "
                 f"median {median} s; load average now {os.getloadavg()[0]:.1f} on "
                 f"{os.cpu_count()} cores")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
