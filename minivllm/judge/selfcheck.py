"""Proof that an exercise's tests are not vacuous: the solution passes, the untouched starter
fails, and every known-wrong variant fails in the test and manner it declares."""

from __future__ import annotations

import ast
import re
import tempfile
from pathlib import Path

from minivllm.judge.exercise import Exercise, Variant
from minivllm.judge.runner import Grade, grade


def check_solution(ex: Exercise) -> str | None:
    g = grade(ex, ex.solution)
    if g.passed or (not g.failures and all(r["status"] == "skip" for r in g.results)):
        return None
    first = g.failures[0] if g.failures else {"name": "?", "message": "nothing ran"}
    return f"the solution fails {first['name']}: {first['message']}"


def check_starter(ex: Exercise) -> str | None:
    g = grade(ex, ex.starter)
    if g.failures and g.failures[0].get("kind") in ("todo", "error"):
        return unnamed_call(ex, g.failures[0])
    if g.failures or not g.passed:
        return None
    return "the untouched starter passes: the tests cannot tell a missing implementation"


def unnamed_call(ex: Exercise, failure: dict) -> str | None:
    """A problem if a failure raised in the learner's code does not name, on its input line, a
    function or class of the starter (the call that raised: runner's input line rule)."""
    tree = ast.parse(ex.starter.read_text())
    names = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    said = failure.get("input") or ""
    if any(re.search(rf"\b{re.escape(n)}\b", said) for n in names):
        return None
    return (f"the starter's first failure ({failure['name']}) raised in your code, but its input "
            f"line names no function of {ex.starter.name}: {said!r}")


def check_variant(ex: Exercise, variant: Variant) -> str | None:
    source = variant.apply(ex.solution.read_text())
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / ex.file
        path.write_text(source)
        g = grade(ex, path)
    return variant_problem(g, variant)


def variant_problem(g: Grade, variant: Variant) -> str | None:
    if not g.failures:
        if all(r["status"] == "skip" for r in g.results):
            return None
        return f"variant {variant.name!r} passes every test"
    first = g.failures[0]
    kind = first.get("kind", "fail")
    if first["name"] != variant.test or kind != variant.kind:
        return (f"variant {variant.name!r} should fail {variant.test} ({variant.kind}) but first "
                f"failed {first['name']} ({kind}): {first['message'][:300]}")
    if variant.contains and variant.contains not in first["message"]:
        return (f"variant {variant.name!r}: the failure message lacks {variant.contains!r}:\n"
                f"{first['message'][:500]}")
    return None


def check_all(ex: Exercise, log=print) -> list[str]:
    problems = []
    for label, fn in (("solution passes", check_solution), ("starter fails", check_starter)):
        problem = fn(ex)
        log(f"  {'ok ' if problem is None else 'BAD'}  {label}" + (f": {problem}" if problem else ""))
        problems += [problem] if problem else []
    for variant in ex.variants():
        problem = check_variant(ex, variant)
        log(f"  {'ok ' if problem is None else 'BAD'}  variant fails as declared: {variant.name}"
            + (f": {problem}" if problem else ""))
        problems += [problem] if problem else []
    return problems
