"""No exercise is vacuous: for every exercise the solution passes, the untouched starter fails,
and each known-wrong variant fails first in the test, and in the way, it declares."""

import pytest

from minivllm.judge import exercise, selfcheck

EXERCISES = exercise.all_exercises()
VARIANTS = [(ex, v) for ex in EXERCISES for v in ex.variants()]


def test_every_exercise_has_a_hint_a_solution_a_statement_and_variants():
    for ex in EXERCISES:
        for path in (ex.folder / "hint.md", ex.folder / "README.md", ex.solution, ex.starter, ex.tests):
            assert path.exists(), f"exercise {ex.number} lacks {path}"
        assert ex.variants(), f"exercise {ex.number} has no known-wrong variants"


@pytest.mark.parametrize("ex", EXERCISES, ids=[e.number for e in EXERCISES])
def test_solution_passes(ex):
    problem = selfcheck.check_solution(ex)
    assert problem is None, problem


@pytest.mark.parametrize("ex", EXERCISES, ids=[e.number for e in EXERCISES])
def test_starter_fails(ex):
    problem = selfcheck.check_starter(ex)
    assert problem is None, problem


@pytest.mark.parametrize("ex,variant", VARIANTS, ids=[f"{e.number}-{v.name[:40]}" for e, v in VARIANTS])
def test_variant_fails_as_declared(ex, variant):
    problem = selfcheck.check_variant(ex, variant)
    assert problem is None, problem
