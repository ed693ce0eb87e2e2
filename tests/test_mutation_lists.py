"""The mutant lists in practice/*/requirements.md (`## Equivalent mutants`, `## Message-text
mutants`) name mutants that scripts/mutation_score.py still makes from the current solution, each
with a reason, and the code the starter gives verbatim is excluded from mutation in the solution.
Generation only: nothing is graded here (the script grades every mutant, listed ones too, and
fails an entry the judge kills)."""

import ast

import pytest

from minivllm.judge import exercise, mutants

EXERCISES = exercise.all_exercises()


@pytest.mark.parametrize("ex", EXERCISES, ids=[e.number for e in EXERCISES])
def test_listed_mutants_exist_and_say_why(ex):
    listed = mutants.listed_mutants(ex.folder / "requirements.md")  # ValueError: bad line
    if not listed:
        return
    made = {m.id for m in mutants.make_mutants(ex.solution.read_text(),
                                               f"solutions/{ex.solution.name}")}
    stale = sorted(set(listed) - made)
    assert not stale, (f"{ex.folder.name}/requirements.md lists mutants that "
                       f"{ex.solution.name} no longer gives: {stale}; run "
                       f"scripts/mutation_score.py {ex.number} for the current ids")
    unexplained = sorted(i for i, (_, why) in listed.items() if not why)
    assert not unexplained, (f"{ex.folder.name}/requirements.md: listed mutants without a "
                             f"reason after the colon: {unexplained}")


def _defs(tree: ast.AST, prefix: str = ""):
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield prefix + node.name, node
            if isinstance(node, ast.ClassDef):
                yield from _defs(node, prefix + node.name + ".")


@pytest.mark.parametrize("ex", EXERCISES, ids=[e.number for e in EXERCISES])
def test_given_code_is_not_mutated(ex):
    """A class or function the starter gives as is (Structs, helper servers, setup_*) is not the
    learner's to write: the solution marks it `# pragma: no mutate block`, so no mutant of it
    is graded or listed."""
    source = ex.solution.read_text()
    given = dict(_defs(ast.parse(ex.starter.read_text())))
    spans = [(name, node.lineno, node.end_lineno) for name, node in _defs(ast.parse(source))
             if name in given and ast.dump(given[name]) == ast.dump(node)]
    made = mutants.make_mutants(source, f"solutions/{ex.solution.name}")
    mutated = sorted({name for name, lo, hi in spans for m in made if lo <= m.line <= hi})
    assert not mutated, (f"{ex.solution.name}: mutants are made from code the starter gives "
                         f"verbatim: {mutated}; end its def or class line with "
                         f"`# pragma: no mutate block`")


def test_ids_survive_edits_elsewhere():
    """An id depends on its function and its lines, not on where they are in the file."""
    source = "def f(a):\n    return a + 1\n\n\ndef g(b):\n    return b * 2\n"
    moved = "import os\n\n\ndef g(b):\n    return b * 2\n\n\ndef f(a):\n    return a + 1\n"
    ids = {(m.function, m.id) for m in mutants.make_mutants(source)}
    assert ids and ids == {(m.function, m.id) for m in mutants.make_mutants(moved)}


def test_pragma_block_excludes_a_whole_def():
    source = ("def given(a):  # pragma: no mutate block\n    return a + 1\n\n\n"
              "def learner(b):\n    return b * 2\n")
    assert {m.function for m in mutants.make_mutants(source)} == {"learner"}


def test_list_format(tmp_path):
    req = tmp_path / "requirements.md"
    req.write_text("# R\n\n## Equivalent mutants\n\n- 0123abcd: the copy is never seen\n"
                   "- 0123abcd-2: same, second site\n\n## Message-text mutants\n\n"
                   "- 4567cdef: the ValueError's wording\n\n## Other\n- not an entry\n")
    assert mutants.listed_mutants(req) == {
        "0123abcd": ("equivalent", "the copy is never seen"),
        "0123abcd-2": ("equivalent", "same, second site"),
        "4567cdef": ("message text", "the ValueError's wording")}
    assert mutants.equivalent_mutants(req) == {"0123abcd": "the copy is never seen",
                                               "0123abcd-2": "same, second site"}
    req.write_text("## Message-text mutants\n- 0123abcd the colon is missing\n")
    with pytest.raises(ValueError, match="requirements.md:2"):
        mutants.listed_mutants(req)
    req.write_text("## Equivalent mutants\n- 0123abcd: a\n## Message-text mutants\n"
                   "- 0123abcd: b\n")
    with pytest.raises(ValueError, match="listed twice"):
        mutants.listed_mutants(req)


def test_score_grades_listed_mutants_and_fails_stale_entries():
    """scripts/mutation_score.py: a listed mutant that survives counts in its category, one the
    judge kills (or no longer made) is a stale entry, and either fails the sweep."""
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "scripts" / "mutation_score.py"
    spec = importlib.util.spec_from_file_location("mutation_score", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    graded = {"verdict": "survived", "test": "", "seconds": 1.0, "line": 1, "function": "",
              "diff": ""}
    result = {"exercise": "999", "title": "t", "made": 5, "wall_s": 1.0, "time_limit_s": 60,
              "listed": {"a": ["equivalent", "why"], "b": ["message text", "why"],
                         "c": ["equivalent", "why"]},
              "not_made": ["d"],
              "mutants": {"a": graded, "b": graded, "c": {**graded, "verdict": "killed"},
                          "e": {**graded, "verdict": "killed"}, "f": graded}}
    s = script.summary(result)
    assert (s["equivalent"], s["message_text"], s["killed"], s["survived"], s["stale"]) == \
        (1, 1, 2, 1, 2)
    assert s["score"] == round(2 / 3, 3)
    assert not script.passed(result)
    text = script.format_result(result)
    assert "STALE: c" in text and "STALE: d" in text and "SURVIVOR f" in text
