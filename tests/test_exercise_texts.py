"""Every number an exercise's README gives with a unit or a noun ("3,000 requests of 64 KiB",
"idle_timeout=0.5 must", "after 2.4 s") is a number its tests use.

Where: a paragraph of the README (a list item, e.g. of "How it is graded") that names tests
in backticks is checked against those tests alone: their source, their @test input, and the
helpers and module constants they use, followed name by name. Any other paragraph is checked
against the whole tests.py. A number counts as used if it is a numeric literal, a constant
expression (64 * 1024), or a number written in a string of that scope; with a unit it may also
appear converted (64 KiB as 65536, 300 ms as 0.3). A README number that the tests compute
(0.3 s x 8 arrivals = 2.4 s) is listed in DERIVED with the expression over tests.py's
constants that must give it; one that is no graded input (a vLLM default the README quotes)
is listed in NOT_GRADED with the reason.
"""

from __future__ import annotations

import ast
import operator
import re

import pytest

from minivllm.judge import exercise

EXERCISES = exercise.all_exercises()
UNITS = {"KiB": 1024, "MiB": 1 << 20, "GiB": 1 << 30, "bytes": 1, "byte": 1, "B": 1,
         "ms": 1e-3, "s": 1}
NUMBER = r"(\d[\d,]*(?:\.\d+)?)"
# a number, not inside a word, a version or U+2028, then a unit or a noun: "3,000 requests"
STATED = re.compile(r"(?<![\w.+])" + NUMBER + r"\s*(KiB|MiB|GiB|bytes?|B|ms|s|[a-z][a-z-]+)\b")
PASSED = re.compile(r"[=(]\s*" + NUMBER + r"(?=\s*[,)`])")  # an argument: f(1.2), timeout=0
NOT_A_NOUN = {"for", "of", "and", "or", "to", "in", "the", "is", "a", "at", "then", "on", "by",
              "with", "as", "if", "it", "its", "per", "from", "into", "are", "be", "was"}
CITATION = re.compile(r"`?[\w/.-]+\.py:\d+(-\d+)?`?")  # vLLM's path:line: no graded input
# (exercise, the README's words): the expression over tests.py's constants that gives it
DERIVED = {
    ("422", "0.8 s"): "HEADERS_S + FIRST_S",  # the first token's time: headers, then the token
    ("431", "2.4 s"): "TRICKLE_GAP_S * TRICKLE_N",  # 8 arrivals 0.3 s apart
    ("432", "11 s"): "61 - 50",  # the README's two clock readings, t=61 and t=50
}
NOT_GRADED = {
    ("432", "300 s"): "vLLM's default step timeout (VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS)",
}
WORDS_ONLY = {"402"}  # its graded list counts in words ("three requests", "two engines")
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Pow: operator.pow,
        ast.LShift: operator.lshift, ast.Mod: operator.mod}


def value(node: ast.AST, names: dict | None = None):
    """A number from literals, names in `names` and arithmetic; None if it is anything else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) \
            and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.Name) and names is not None:
        found = names.get(node.id)
        return found if isinstance(found, (int, float)) else None
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = value(node.operand, names)
        return None if inner is None else -inner
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = value(node.left, names), value(node.right, names)
        if left is None or right is None or (isinstance(node.op, ast.Pow) and right > 64):
            return None
        try:
            return _OPS[type(node.op)](left, right)
        except ArithmeticError:
            return None
    return None


def numbers_in(node: ast.AST) -> set[float]:
    """The numbers a piece of tests.py uses: literals, constant expressions, and numbers
    written in its strings (an @test input, a message)."""
    found = set()
    for n in ast.walk(node):
        v = value(n)
        if v is not None:
            found.add(v)
        elif isinstance(n, ast.Constant) and isinstance(n.value, str):
            found |= {float(m.replace(",", "")) for m in
                      re.findall(r"\d+(?:,\d{3})*(?:\.\d+)?", n.value)}
    return found


def top_level(tree: ast.Module) -> dict[str, ast.AST]:
    """Each module-level name of tests.py and the statement that defines it."""
    found = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            found[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                found.update({n.id: node for n in ast.walk(t) if isinstance(n, ast.Name)})
    return found


def used_by(tree: ast.Module, names: list[str]) -> set[float]:
    """The numbers of the named tests and of everything module-level they name, followed."""
    defined, seen, todo, found = top_level(tree), set(), list(names), set()
    while todo:
        name = todo.pop()
        if name in seen or name not in defined:
            continue
        seen.add(name)
        found |= numbers_in(defined[name])
        todo += [n.id for n in ast.walk(defined[name]) if isinstance(n, ast.Name)]
    return found


def constants(tree: ast.Module) -> dict[str, float]:
    """tests.py's module-level numeric constants (A = 1.0; B, C = 2, A * 3)."""
    names: dict = {}
    for node in tree.body:
        if not isinstance(node, ast.Assign):
            continue
        for target in node.targets:
            pairs = ([(target, node.value)] if isinstance(target, ast.Name) else
                     list(zip(target.elts, node.value.elts))
                     if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple)
                     else [])
            for t, v in pairs:
                if isinstance(t, ast.Name) and value(v, names) is not None:
                    names[t.id] = value(v, names)
    return names


def registered_tests(tree: ast.Module) -> list[str]:
    return [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and any(
        isinstance(d, ast.Call) and getattr(d.func, "id", "") == "test" for d in n.decorator_list)]


def paragraphs(readme: str) -> list[str]:
    """The README cut into list items and paragraphs, vLLM's path:line citations removed."""
    return re.split(r"\n(?=\s*\d+\.\s|\s*-\s)|\n\n", CITATION.sub("", readme))


def stated_numbers(paragraph: str) -> list[tuple[str, float, str]]:
    """(the words, the number, its unit or noun) of each number stated with a unit or noun."""
    return ([(m.group(0), float(m.group(1).replace(",", "")), m.group(2))
             for m in STATED.finditer(paragraph) if m.group(2) not in NOT_A_NOUN]
            + [(m.group(0), float(m.group(1)), "") for m in PASSED.finditer(paragraph)
               if "," not in m.group(1)])


def mismatches(readme: str, tests_source: str) -> tuple[list[str], int]:
    """The README's numbers that no test in their scope uses, and how many were checked."""
    tree = ast.parse(tests_source)
    tests, everything = registered_tests(tree), numbers_in(tree)
    wrong, checked = [], 0
    for para in paragraphs(readme):
        named = [t for t in tests if f"`{t}`" in para]
        used = used_by(tree, named) if named else everything
        for words, number, unit in stated_numbers(para):
            checked += 1
            if not (_uses(used, number) or unit in UNITS and _uses(used, number * UNITS[unit])):
                wrong.append(f"{words!r} ({', '.join(named) or 'any test'})")
    return wrong, checked


def _uses(used: set[float], number: float) -> bool:
    return any(abs(u - number) <= 1e-9 * max(1.0, abs(number)) for u in used)


def excused(ex, words: str) -> bool:
    return (ex.number, words.strip("'\"")) in DERIVED.keys() | NOT_GRADED.keys()


@pytest.mark.parametrize("ex", EXERCISES, ids=[e.number for e in EXERCISES])
def test_every_number_the_readme_states_is_one_its_tests_use(ex):
    readme = (ex.folder / "README.md").read_text()
    wrong, checked = mismatches(readme, ex.tests.read_text())
    wrong = [w for w in wrong if not excused(ex, w.split(" (")[0])]
    assert not wrong, (f"exercise {ex.number}'s README states numbers its tests do not use: "
                       f"{wrong}; make them agree (or, for a number the tests compute, add "
                       f"it to DERIVED)")
    if "How it is graded" in readme and ex.number not in WORDS_ONLY:
        assert checked, f"exercise {ex.number}'s graded list states no number this test reads"


@pytest.mark.parametrize("key", sorted(DERIVED), ids=["-".join(k) for k in sorted(DERIVED)])
def test_a_derived_number_is_what_the_tests_constants_give(key):
    number, words = key
    ex = exercise.find(number)
    assert words in (ex.folder / "README.md").read_text(), f"{words!r} left {number}'s README"
    names = constants(ast.parse(ex.tests.read_text()))
    got = value(ast.parse(DERIVED[key], mode="eval").body, names)
    assert got is not None and abs(got - float(words.split()[0])) < 1e-9, (key, got)


def test_a_number_not_graded_is_still_in_its_readme():
    for (number, words) in NOT_GRADED:
        assert words in (exercise.find(number).folder / "README.md").read_text(), words


def test_the_check_catches_a_readme_that_says_3000_where_the_test_sends_300():
    """The slip that made this test: 201's README said 3,000 requests of 64 KiB, its test
    queued 300."""
    tests = exercise.find("201").tests.read_text()
    item = ("3. `close_with_a_stuck_engine`: an engine says READY, then reads nothing; {n} "
            "requests of\n   64 KiB are queued for it; `close()` must return.")
    assert mismatches(item.format(n="300"), tests)[0] == []
    wrong, checked = mismatches(item.format(n="3,000"), tests)
    assert checked == 2 and wrong == ["'3,000 requests' (close_with_a_stuck_engine)"]
    assert mismatches(item.format(n="300").replace("64 KiB", "32 KiB"), tests)[0]
