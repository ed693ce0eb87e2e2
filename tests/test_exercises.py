"""No exercise is vacuous: for every exercise the solution passes, the untouched starter fails,
and each known-wrong variant fails first in the test, and in the way, it declares."""

import pytest

from exercise_checks import run_all

from minivllm.judge import exercise

EXERCISES = exercise.all_exercises()
VARIANTS = [(ex, v) for ex in EXERCISES for v in ex.variants()]


def test_every_exercise_has_a_hint_a_solution_a_statement_and_variants():
    for ex in EXERCISES:
        for path in (ex.folder / "hint.md", ex.folder / "README.md", ex.solution, ex.starter, ex.tests):
            assert path.exists(), f"exercise {ex.number} lacks {path}"
        assert ex.variants(), f"exercise {ex.number} has no known-wrong variants"


ALL_CHECKS_TIMEOUT_S = 3600  # every check, a few at a time, runs in the first test's setup
KINDS = {"test_solution_passes": "solution", "test_starter_fails": "starter",
         "test_variant_fails_as_declared": "variant"}


@pytest.fixture(scope="module")
def verdicts(request):
    """The checks of the selected tests of this module, run a few at a time
    (tests/exercise_checks.py), in the first one's setup."""
    keys = []
    for item in request.session.items:
        kind, params = KINDS.get(item.originalname), getattr(item, "callspec", None)
        if item.module.__name__ == __name__ and kind and params:
            variant = params.params.get("variant")
            keys.append((kind, params.params["ex"].number, variant.name if variant else ""))
    return run_all(keys)


def verdict(verdicts, key):
    assert key in verdicts, f"the check {key} reported nothing (its shard died?)"
    return verdicts[key]


@pytest.mark.timeout(ALL_CHECKS_TIMEOUT_S)
@pytest.mark.parametrize("ex", EXERCISES, ids=[e.number for e in EXERCISES])
def test_solution_passes(verdicts, ex):
    problem = verdict(verdicts, ("solution", ex.number, ""))
    assert problem is None, problem


@pytest.mark.timeout(ALL_CHECKS_TIMEOUT_S)
@pytest.mark.parametrize("ex", EXERCISES, ids=[e.number for e in EXERCISES])
def test_starter_fails(verdicts, ex):
    problem = verdict(verdicts, ("starter", ex.number, ""))
    assert problem is None, problem


@pytest.mark.timeout(ALL_CHECKS_TIMEOUT_S)
@pytest.mark.parametrize("ex,variant", VARIANTS, ids=[f"{e.number}-{v.name[:40]}" for e, v in VARIANTS])
def test_variant_fails_as_declared(verdicts, ex, variant):
    problem = verdict(verdicts, ("variant", ex.number, variant.name))
    assert problem is None, problem


# Issue 22's contract for every exercise: a requirements table beside its tests that names
# each test and the variants only it catches, at least MIN_VARIANTS variants, every test needed
# by some variant, and every "fail" variant checked for a message that names its cause.
MIN_VARIANTS = 10


def registered_tests(ex) -> list[str]:
    """The names of tests.py's @test functions, in order, read without running the file."""
    import ast
    tree = ast.parse(ex.tests.read_text())
    return [node.name for node in tree.body if isinstance(node, ast.FunctionDef)
            and any(isinstance(d, ast.Call) and getattr(d.func, "id", "") == "test"
                    for d in node.decorator_list)]


def requirement_rows(ex) -> list[tuple[str, str, str]]:
    """(requirement, test cell, variants cell) for each row of requirements.md's table."""
    rows = []
    for line in (ex.folder / "requirements.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.lstrip().startswith("|") and len(cells) >= 3 and not set(cells[1]) <= set("-: "):
            rows.append((cells[0], cells[1], " | ".join(cells[2:])))
    return rows[1:]  # the header row


@pytest.mark.parametrize("ex", EXERCISES, ids=[e.number for e in EXERCISES])
def test_requirements_table_names_every_test_and_variant(ex):
    path = ex.folder / "requirements.md"
    assert path.exists(), f"exercise {ex.number} has no requirements.md beside its tests"
    rows = requirement_rows(ex)
    tests = registered_tests(ex)
    for name in tests:
        assert any(f"`{name}`" in cell for _, cell, _ in rows), \
            f"exercise {ex.number}: test {name} checks no requirement in requirements.md"
    for v in ex.variants():
        assert any(f"`{v.test}`" in cell and v.name in caught for _, cell, caught in rows), \
            f"exercise {ex.number}: variant {v.name!r} is not listed in the row of {v.test}"


@pytest.mark.parametrize("ex", EXERCISES, ids=[e.number for e in EXERCISES])
def test_every_test_is_needed_and_every_variant_names_its_cause(ex):
    variants = ex.variants()
    assert len(variants) >= MIN_VARIANTS, \
        f"exercise {ex.number} has {len(variants)} known-wrong variants, fewer than {MIN_VARIANTS}"
    needed = {v.test for v in variants}
    for name in registered_tests(ex):
        assert name in needed, f"exercise {ex.number}: no variant needs test {name}"
    for v in variants:
        assert v.kind != "fail" or v.contains, \
            f"exercise {ex.number}: variant {v.name!r} fails without `contains` naming its cause"
