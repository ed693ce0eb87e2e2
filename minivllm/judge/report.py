"""How the judge prints: one line per test, then the first failure in full, on one screen."""

from __future__ import annotations

import sys

from minivllm.judge.runner import Grade

MAX_DETAIL_LINES = 45  # keep the first failure on one screen
MARKS = {"pass": "PASS", "fail": "FAIL", "skip": "SKIP", "not run": " -- "}
COLORS = {"pass": "32", "fail": "31", "skip": "33", "not run": "90"}


def _color(text: str, status: str) -> str:
    if not sys.stdout.isatty():
        return text
    return f"\033[{COLORS[status]}m{text}\033[0m"


def _clip(text: str, limit: int) -> str:
    lines = text.rstrip().splitlines()
    if len(lines) <= limit:
        return "\n".join(lines)
    return "\n".join(lines[:limit] + [f"... ({len(lines) - limit} more lines)"])


def format_failure(r: dict) -> str:
    kind = {"timeout": "timed out", "leak": "left something behind", "todo": "not implemented",
            "error": "crashed"}.get(r.get("kind", ""), "wrong result")
    lines = [f"First failure: {r['name']} ({kind})"]
    if r.get("input"):
        lines.append(f"  input:    {r['input']}")
    lines.append("  problem:  " + r.get("message", "").replace("\n", "\n            "))
    if r.get("differs"):
        lines.append(f"  differs:  {r['differs']}")
    if r.get("expected") is not None:
        lines.append(f"  expected: {r['expected']}")
    if r.get("got") is not None:
        lines.append(f"  got:      {r['got']}")
    for leak in r.get("leaks", []) if r.get("kind") != "leak" else []:
        lines.append(f"  also:     {leak}")
    if r.get("detail"):
        lines.append("")
        lines.append(r["detail"].rstrip())
    if r.get("output"):
        lines.append("\n  what your code printed (last lines):")
        lines += ["    " + line for line in r["output"].splitlines()]
    return _clip("\n".join(lines), MAX_DETAIL_LINES)


def format_grade(g: Grade) -> str:
    ex = g.exercise
    width = max(len(r["name"]) for r in g.results) if g.results else 10
    out = [f"Exercise {ex.number}: {ex.title} (chapter {ex.chapter})", f"grading {g.path}", ""]
    for r in g.results:
        secs = f"{r['seconds']:.1f} s" if "seconds" in r else ""
        note = r["message"] if r["status"] == "skip" else r.get("note", "")
        out.append(f"  {_color(MARKS[r['status']], r['status'])}  {r['name']:<{width}}  {secs} {note}")
    out.append("")
    failures = g.failures
    if failures:
        out.append(format_failure(failures[0]))
        out.append("")
        out.append(f"{len(failures)} failing. Fix the first failure, then grade again. "
                   f"Stuck? python judge.py {ex.number} --hint")
    elif g.passed:
        skipped = sum(r["status"] == "skip" for r in g.results)
        out.append(_color("All tests passed.", "pass")
                   + (f" ({skipped} skipped: capability missing)" if skipped else ""))
    else:
        out.append(_color("Nothing ran: every test needs a capability this machine lacks.", "skip"))
    return "\n".join(out)
