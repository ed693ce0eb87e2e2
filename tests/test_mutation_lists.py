"""The `## Equivalent mutants` lists in practice/*/requirements.md name mutants that
scripts/mutation_score.py still makes from the current solution, each with a reason.
Generation only: nothing is graded (that is the script's job, outside the suite)."""

import pytest

from minivllm.judge import exercise, mutants

EXERCISES = exercise.all_exercises()


@pytest.mark.parametrize("ex", EXERCISES, ids=[e.number for e in EXERCISES])
def test_equivalent_mutants_exist_and_say_why(ex):
    listed = mutants.equivalent_mutants(ex.folder / "requirements.md")  # ValueError: bad line
    if not listed:
        return
    made = {m.id for m in mutants.make_mutants(ex.solution.read_text(),
                                               f"solutions/{ex.solution.name}")}
    stale = sorted(set(listed) - made)
    assert not stale, (f"{ex.folder.name}/requirements.md lists equivalent mutants that "
                       f"{ex.solution.name} no longer gives: {stale}; run "
                       f"scripts/mutation_score.py {ex.number} for the current ids")
    unexplained = sorted(i for i, why in listed.items() if not why)
    assert not unexplained, (f"{ex.folder.name}/requirements.md: equivalent mutants without a "
                             f"reason after the colon: {unexplained}")


def test_ids_survive_edits_elsewhere():
    """An id depends on its function and its lines, not on where they are in the file."""
    source = "def f(a):\n    return a + 1\n\n\ndef g(b):\n    return b * 2\n"
    moved = "import os\n\n\ndef g(b):\n    return b * 2\n\n\ndef f(a):\n    return a + 1\n"
    ids = {(m.function, m.id) for m in mutants.make_mutants(source)}
    assert ids and ids == {(m.function, m.id) for m in mutants.make_mutants(moved)}


def test_list_format(tmp_path):
    req = tmp_path / "requirements.md"
    req.write_text("# R\n\n## Equivalent mutants\n\n- 0123abcd: the copy is never seen\n"
                   "- 0123abcd-2: same, second site\n\n## Other\n- not an entry\n")
    assert mutants.equivalent_mutants(req) == {"0123abcd": "the copy is never seen",
                                               "0123abcd-2": "same, second site"}
    req.write_text("## Equivalent mutants\n- 0123abcd the colon is missing\n")
    with pytest.raises(ValueError, match="requirements.md:2"):
        mutants.equivalent_mutants(req)
