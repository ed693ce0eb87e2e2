"""Rules every chapter page keeps, checked on its text alone (no kernel runs):

- no answer before its exercise: a chapter shows no run of 4 non-blank lines from a function of
  `solutions/`, imports or runs no reference solution, and prints no source of the engine's own
  version of what an exercise asks for (chapter_answers.ENGINE_ANSWERS), in its cells or in the
  outputs of its last executed run (_build/executed/, when newer than the chapter), except in a
  cell folded on the website (tags `hide-input`, and `hide-output` where the output shows it)
  under a heading "After you solve NNN";
- a page teaches: at most MAX_PROSE_WORDS words of prose, and no "issue N" from the tracker;
- the words are defined: the glossary defines every term of GLOSSARY_TERMS under a heading, each
  chapter links the glossary, and every `glossary.md#anchor` link lands on a heading there.
"""

from __future__ import annotations

import ast
import functools
import re
import tomllib
from pathlib import Path

import pytest
from chapter_answers import (WINDOW, body_lines, cells, engine_windows, find_node,
                             imported_names, lines_of, printed_answers, solution_windows, windows)

ROOT = Path(__file__).resolve().parent.parent
CHAPTER_DIR = ROOT / "chapters"
CHAPTERS = sorted(CHAPTER_DIR.glob("[0-9][0-9]_*.md"))
GLOSSARY = CHAPTER_DIR / "glossary.md"
MAX_PROSE_WORDS = 4000
GLOSSARY_TERMS = ("tp", "dp", "pp", "engine-core", "executor", "worker", "scheduler-output",
                  "kv-cache-blocks", "block-ids", "preemption", "prefix-caching",
                  "dp-coordinator", "waves", "enginecoreoutputs", "prefill", "decode", "logits",
                  "sampling", "ttft", "itl", "all-reduce", "moe", "pipeline-parallelism")
RUNS_A_SOLUTION = re.compile(r"^\s*(from|import)\s+solutions\b|[\"']solutions[\"'/]|\.variants\(\)"
                             r"|--solution\b|\.solution\b", re.M)
ISSUE_REF = re.compile(r"\bissues?\s+#?\d+", re.I)
GLOSSARY_LINK = re.compile(r"\]\(glossary\.md(?:#([^)\s]*))?\)")
AFTER_YOU_SOLVE = re.compile(r"after you solve", re.I)
FOLDS = {"source": {"hide-input", "hide-cell", "remove-input", "remove-cell"},
         "output": {"hide-output", "hide-cell", "remove-output", "remove-cell"}}


@functools.cache
def exercise_chapter(number: str) -> str:
    folder = next((ROOT / "practice").glob(f"{number}_*"))
    return tomllib.loads((folder / "exercise.toml").read_text())["chapter"]


def folded_after(cell: dict, number: str | None, shown_in: str, chapter: Path) -> bool:
    """Folded on the website (hide-input folds the source, hide-output the output, hide-cell
    both) under a heading "After you solve NNN", NNN this exercise; an exercise of an earlier
    chapter may sit under any such heading."""
    if not (FOLDS[shown_in] & cell["tags"]) or not AFTER_YOU_SOLVE.search(cell["heading"]):
        return False
    return (number is None or number in re.findall(r"\d{3}", cell["heading"])
            or exercise_chapter(number) < chapter.name[:2])


def fold_advice(cell: dict, number: str | None) -> str:
    return (f"fold it: tags hide-input and hide-output (it has {sorted(cell['tags']) or 'none'}) "
            f"under a heading 'After you solve {number or 'NNN'}' (it is under "
            f"{cell['heading'][:60]!r})")


# --- the rules --------------------------------------------------------------------------------
def shown(cell: dict, table: dict, shown_in: str) -> list:
    """What of `table` (window -> where it comes from) the cell's source or output shows."""
    lines = lines_of(cell["source"] if shown_in == "source" else cell["output"])
    return sorted({table[w] for w in windows(lines) if w in table})


def answer_problems(chapter: Path) -> list[str]:
    problems, names = [], imported_names(chapter)
    for cell in cells(chapter):
        where = cell["where"]
        for shown_in in ("source", "output"):
            for origin in shown(cell, solution_windows(), shown_in):
                number = Path(origin.split(":")[0]).name[:3]
                if not folded_after(cell, number, shown_in, chapter):
                    problems.append(f"{where}: its {shown_in} shows {WINDOW}+ lines of the "
                                    f"reference answer {origin}; {fold_advice(cell, number)}")
            for number, origin in shown(cell, engine_windows(), shown_in):
                if not folded_after(cell, number, shown_in, chapter):
                    problems.append(f"{where}: its {shown_in} shows {WINDOW}+ lines of {origin}, "
                                    f"the engine's answer to exercise {number}; "
                                    f"{fold_advice(cell, number)}")
        if cell["kind"] == "code" and (m := RUNS_A_SOLUTION.search(cell["source"])) \
                and not folded_after(cell, None, "source", chapter):
            problems.append(f"{where}: imports or runs a reference solution ({m[0].strip()!r}); "
                            f"{fold_advice(cell, None)}")
        for number, answer in printed_answers(cell, names) if cell["kind"] == "code" else []:
            if not all(folded_after(cell, number, side, chapter) for side in FOLDS):
                problems.append(f"{where}: prints the source of {answer}, the engine's answer "
                                f"to exercise {number}; {fold_advice(cell, number)}")
    return problems


def prose_words(chapter: Path) -> int:
    """Words in markdown cells, leaving out fenced code and HTML comments."""
    text = "\n".join(c["source"] for c in cells(chapter) if c["kind"] == "markdown")
    text = re.sub(r"^(```|~~~).*?^\1", "", text, flags=re.M | re.S)
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    return len(text.split())


def slug(heading: str) -> str:
    """The anchor MyST gives a heading (myst_heading_anchors), as GitHub does."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@functools.cache
def glossary_entries() -> dict[str, str]:
    """Anchor -> the text under that heading, for every heading of the glossary."""
    entries, anchor = {}, None
    for line in GLOSSARY.read_text().splitlines():
        if m := re.match(r"#+\s+(.*)", line):
            anchor = slug(m[1])
            entries[anchor] = ""
        elif anchor is not None:
            entries[anchor] += line + "\n"
    return entries


# --- the tests ----------------------------------------------------------------------------------
IDS = [p.stem for p in CHAPTERS]


@pytest.mark.parametrize("chapter", CHAPTERS, ids=IDS)
def test_no_answer_before_its_exercise(chapter):
    problems = answer_problems(chapter)
    assert not problems, (
        f"{chapter.name} shows an exercise's answer (rule: no answer before its exercise; move it "
        "to a cell tagged hide-input, and hide-output where the output shows it, under a heading "
        "'After you solve NNN', or show less):\n" + "\n".join(problems))


@pytest.mark.parametrize("chapter", CHAPTERS, ids=IDS)
def test_page_teaches(chapter):
    words = prose_words(chapter)
    issues = sorted(set(ISSUE_REF.findall(chapter.read_text())))
    problems = [f"{words} words of prose, over the budget of {MAX_PROSE_WORDS}: move history to "
                "figures/reference_numbers.md or split the page"] if words > MAX_PROSE_WORDS else []
    problems += [f"names the tracker's {ref!r}: state what holds instead" for ref in issues]
    assert not problems, f"{chapter.name} (rule: a chapter teaches):\n" + "\n".join(problems)


def test_glossary_defines_every_term():
    entries = glossary_entries()
    missing = [t for t in GLOSSARY_TERMS if t not in entries]
    thin = [t for t in GLOSSARY_TERMS if t in entries and len(entries[t].split()) < 15]
    assert not missing and not thin, (
        f"chapters/glossary.md: no '### term' heading for {missing}; a heading with under 15 "
        f"words of definition for {thin}")


@pytest.mark.parametrize("chapter", CHAPTERS, ids=IDS)
def test_chapter_links_the_glossary(chapter):
    anchors = GLOSSARY_LINK.findall(chapter.read_text())
    known = glossary_entries()
    broken = sorted({a for a in anchors if a and a not in known})
    good = [a for a in anchors if a in known]
    problems = ([] if good else ["links no glossary term: link a term where the page first uses "
                                 "it, as [engine core](glossary.md#engine-core)"])
    problems += [f"links glossary.md#{a}, which is no heading of chapters/glossary.md"
                 for a in broken]
    assert not problems, f"{chapter.name} (rule: words are defined):\n" + "\n".join(problems)


def test_the_rules_catch_an_answer(tmp_path):
    """The checks are not vacuous: four lines of a reference answer, a run of a solution, a
    getsource of ShmRingBuffer and one of a module that holds 101's answer are caught in the open;
    folded under "After you solve 213", only 101's remains (its own heading is missing)."""
    source = (ROOT / "solutions" / "213_shm_ring_buffer.py").read_text()
    body = body_lines(source, find_node(ast.parse(source), "RingWriter.try_write"))
    pasted = "\n".join(body[:WINDOW + 2])
    printed = ("import inspect\nfrom minivllm.distributed import shm_ring\n"
               "print(inspect.getsource(shm_ring.ShmRingBuffer))")
    module = "from minivllm.utils import mp\nprint(inspect.getsource(mp))"

    def caught(heading: str, tags: str) -> list[str]:
        path = tmp_path / "00_probe.md"  # before every exercise's chapter
        fence = "```{code-cell} ipython3\n" + (f":tags: [{tags}]\n\n" if tags else "")
        path.write_text(f"# 00\n\n## {heading}\n\n" + "".join(
            f"{fence}{src}\n```\n\n" for src in (pasted, printed, "ex.variants()", module)))
        cells.cache_clear()
        return [p.split(": ", 1)[1].split(";")[0] for p in answer_problems(path)]

    assert caught("A section", "") == [
        "its source shows 4+ lines of the reference answer solutions/213_shm_ring_buffer.py: "
        "try_write",
        "prints the source of minivllm.distributed.shm_ring.ShmRingBuffer, the engine's answer "
        "to exercise 213",
        "imports or runs a reference solution ('.variants()')",
        "prints the source of minivllm.utils.mp.launch, the engine's answer to exercise 101",
        "prints the source of minivllm.utils.mp._wait_ready, the engine's answer to exercise 101"]
    assert caught("After you solve 213", "hide-input, hide-output") == caught("A section", "")[3:]
    assert len(caught("After you solve 213", "hide-input")) == 3  # printed sources still shown
