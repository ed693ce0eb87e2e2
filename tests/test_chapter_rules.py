"""Rules every chapter page keeps, checked on its text alone (no kernel runs):

- no answer before its exercise: a chapter shows no run of 4 non-blank lines from a function of
  `solutions/`, imports or runs no reference solution, and prints no source of the engine's own
  version of what an exercise asks for (ENGINE_ANSWERS), in its cells or in the outputs of its
  last executed run (_build/executed/, when newer than the chapter), except in a cell folded on
  the website (tags `hide-input`, and `hide-output` where the output shows it) under a heading
  "After you solve NNN";
- a page teaches: at most MAX_PROSE_WORDS words of prose, and no "issue N" from the tracker;
- the words are defined: the glossary defines every term of GLOSSARY_TERMS under a heading, each
  chapter links the glossary, and every `glossary.md#anchor` link lands on a heading there.
"""

from __future__ import annotations

import ast
import functools
import json
import re
import tomllib
from pathlib import Path

import jupytext
import pytest

ROOT = Path(__file__).resolve().parent.parent
CHAPTER_DIR = ROOT / "chapters"
CHAPTERS = sorted(CHAPTER_DIR.glob("[0-9][0-9]_*.md"))
GLOSSARY = CHAPTER_DIR / "glossary.md"
EXECUTED = ROOT / "_build" / "executed"
SOLUTIONS = sorted((ROOT / "solutions").glob("[0-9][0-9][0-9]_*.py"))
WINDOW = 4  # consecutive non-blank lines that count as showing code
MAX_PROSE_WORDS = 4000
GLOSSARY_TERMS = ("tp", "dp", "pp", "engine-core", "executor", "worker", "scheduler-output",
                  "kv-cache-blocks", "block-ids", "preemption", "prefix-caching",
                  "dp-coordinator", "waves", "enginecoreoutputs", "prefill", "decode", "logits",
                  "sampling", "ttft", "itl", "all-reduce", "moe", "pipeline-parallelism")

# Exercise -> the engine's own version of its answer, as "module under minivllm/:qualified name"
# (read from each practice/NNN_*/README.md). 215 has none: the engine sends whole steps.
ENGINE_ANSWERS = {
    "101": ("utils/mp.py:launch", "utils/mp.py:_wait_ready"),
    "102": ("utils/process_count.py:serve_process_count",),
    "121": ("bench/_ipc_transports.py:FdStream.recv_into",
            "bench/_ipc_transports.py:SockStream.recv_into"),
    "122": ("bench/_ipc_shm_ring.py:ShmRing",),
    "123": ("bench/_ipc_transports.py:grow_pipe",),
    "201": ("engine/core_client.py:MPClient._wait_for_engines",
            "engine/core_client.py:MPClient._add_frames"),
    "202": ("distributed/shm_broadcast.py:MessageQueue.wait_until_ready",
            "distributed/shm_broadcast.py:MessageQueue._count_subscriptions"),
    "211": ("flat_batch.py:FlatBatch",),
    "212": ("serial.py:MsgpackEncoder", "serial.py:MsgpackDecoder"),
    "213": ("distributed/shm_ring.py:ShmRingBuffer",),
    "214": ("distributed/message_chunk.py:packed_size", "distributed/message_chunk.py:pack_into",
            "distributed/message_chunk.py:unpack_from"),
    "301": ("distributed/weight_transfer.py:update_weights_from_ipc",
            "distributed/weight_protocol.py:check_update"),
    "302": ("distributed/weight_transfer.py:WeightSender",
            "distributed/weight_transfer.py:WeightReceiver",
            "distributed/weight_transfer.py:export_weights",
            "distributed/weight_transfer.py:_export_cpu"),
    "401": ("engine/core_client.py:MPClient._choose_engine",
            "engine/core_client.py:MPClient._forget",
            "engine/launcher.py:wait_for_engine_startup"),
    "402": ("engine/core_proc.py:EngineCoreProc.process_aborts_during_step",
            "engine/core_proc.py:EngineCoreProc._abort",
            "engine/core_io.py:EngineCoreIOMixin.process_input_sockets"),
    "411": ("executor/multiproc_executor.py:MultiprocExecutor.collective_rpc",
            "executor/multiproc_executor.py:MultiprocExecutor._wait_reply",
            "executor/multiproc_executor.py:MultiprocExecutor._start_worker_monitor"),
    "412": ("model/linear.py:column_shard", "model/linear.py:ColumnParallelLinear",
            "model/linear.py:RowParallelLinear"),
    "421": ("engine/detokenizer.py:IncrementalDetokenizer",),
    "422": ("bench/_openai_client.py:stream_completion", "bench/_openai_client.py:_sse_events",
            "bench/_openai_client.py:run_load"),
    "431": ("distributed/shm_broadcast.py:MessageQueue._dequeue_remote",
            "distributed/shm_broadcast.py:MessageQueue._recv"),
    "432": ("distributed/peer_watch.py:PeerWatch",),
}
RUNS_A_SOLUTION = re.compile(r"^\s*(from|import)\s+solutions\b|[\"']solutions[\"'/]|\.variants\(\)"
                             r"|--solution\b|\.solution\b", re.M)
ISSUE_REF = re.compile(r"\bissues?\s+#?\d+", re.I)
GLOSSARY_LINK = re.compile(r"\]\(glossary\.md(?:#([^)\s]*))?\)")
AFTER_YOU_SOLVE = re.compile(r"after you solve", re.I)


# --- the chapter as cells -------------------------------------------------------------------
def lines_of(text: str) -> list[str]:
    """The non-blank lines, stripped: what a reader sees, whatever the indentation."""
    return [s for s in (line.strip() for line in text.splitlines()) if s]


def output_text(outputs: list) -> str:
    parts = []
    for out in outputs:
        text = out.get("text") or out.get("data", {}).get("text/plain", "")
        parts.append(text if isinstance(text, str) else "".join(text))
    return "\n".join(parts)


def executed_outputs(chapter: Path) -> list[str] | None:
    """Each cell's output text from the last executed run, when newer than the chapter."""
    run = EXECUTED / chapter.with_suffix(".ipynb").name
    sources = [chapter, chapter.with_suffix(".ipynb")]
    if not run.exists() or any(s.exists() and s.stat().st_mtime > run.stat().st_mtime
                               for s in sources):
        return None
    return [output_text(c.get("outputs", [])) for c in json.loads(run.read_text())["cells"]]


@functools.cache
def cells(chapter: Path) -> list[dict]:
    """Each cell with its kind, source, tags, the heading it sits under, and its output."""
    nb = jupytext.read(chapter)
    outputs = executed_outputs(chapter)
    if outputs is not None and len(outputs) != len(nb.cells):
        outputs = None  # a run of another version of the cells
    found, heading = [], ""
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            heads = [line for line in cell.source.splitlines() if line.startswith("#")]
            heading = heads[-1].lstrip("# ").strip() if heads else heading
        first = next(iter(lines_of(cell.source)), "")
        found.append({"kind": cell.cell_type, "source": cell.source, "heading": heading,
                      "tags": set(cell.metadata.get("tags", [])),
                      "output": outputs[i] if outputs else "",
                      "where": f"{chapter.name} cell {i} ({first[:50]!r}, under {heading[:50]!r})"})
    return found


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


# --- the answers, as windows of lines -------------------------------------------------------
def body_lines(source: str, node: ast.AST) -> list[str]:
    """A function's or class's lines after its signature and docstring, non-blank, stripped."""
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None),
                                                             ast.Constant):
        body = body[1:] or body
    text = source.splitlines()[body[0].lineno - 1:node.end_lineno]
    return lines_of("\n".join(text))


def windows(lines: list[str]) -> set[tuple[str, ...]]:
    """Every run of WINDOW lines that says something (not four lines of `else:` and `pass`)."""
    return {tuple(lines[i:i + WINDOW]) for i in range(len(lines) - WINDOW + 1)
            if sum(len(s) >= 12 for s in lines[i:i + WINDOW]) >= 3}


@functools.cache
def solution_windows() -> dict[tuple[str, ...], str]:
    found = {}
    for path in SOLUTIONS:
        source = path.read_text()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for w in windows(body_lines(source, node)):
                    found.setdefault(w, f"solutions/{path.name}: {node.name}")
    return found


def find_node(tree: ast.Module, qualname: str) -> ast.AST | None:
    scope: list = tree.body
    node = None
    for part in qualname.split("."):
        node = next((n for n in scope if isinstance(n, (ast.ClassDef, ast.FunctionDef,
                                                         ast.AsyncFunctionDef))
                     and n.name == part), None)
        if node is None:
            return None
        scope = node.body
    return node


@functools.cache
def engine_windows() -> dict[tuple[str, ...], tuple[str, str]]:
    found = {}
    for number, answers in ENGINE_ANSWERS.items():
        for answer in answers:
            path, qualname = answer.split(":")
            source = (ROOT / "minivllm" / path).read_text()
            node = find_node(ast.parse(source), qualname)
            assert node is not None, f"ENGINE_ANSWERS[{number}]: no {qualname} in minivllm/{path}"
            for w in windows(body_lines(source, node)):
                found.setdefault(w, (number, f"minivllm/{path}: {qualname}"))
    return found


def dotted(answer: str) -> str:
    path, qualname = answer.split(":")
    return "minivllm." + path.removesuffix(".py").replace("/", ".") + "." + qualname


# --- which getsource calls print an answer ----------------------------------------------------
def imported_names(chapter: Path) -> dict[str, str]:
    """Every name the chapter's code cells import from minivllm, as its full dotted name."""
    names = {}
    for cell in cells(chapter):
        if cell["kind"] != "code":
            continue
        for node in ast.walk(parse_or_none(cell["source"]) or ast.Module(body=[])):
            if isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    names[alias.asname or alias.name.split(".")[0]] = (
                        alias.name if alias.asname else alias.name.split(".")[0])
    return names


def parse_or_none(source: str) -> ast.Module | None:
    try:
        return ast.parse("\n".join(line for line in source.splitlines()
                                   if not line.lstrip().startswith(("%", "!"))))
    except SyntaxError:
        return None


def resolve(node: ast.AST, names: dict[str, str], strings: set[str]) -> list[str]:
    """The dotted names an expression can mean: `mod.Cls.f`, or `getattr(Cls, name)` with any
    of the cell's string constants as the name."""
    if isinstance(node, ast.Name):
        return [names.get(node.id, node.id)]
    if isinstance(node, ast.Attribute):
        return [f"{base}.{node.attr}" for base in resolve(node.value, names, strings)]
    if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "getattr" and node.args:
        attr = node.args[1] if len(node.args) > 1 else None
        attrs = [attr.value] if isinstance(attr, ast.Constant) else sorted(strings)
        return [f"{base}.{a}" for base in resolve(node.args[0], names, strings) for a in attrs]
    return []


def printed_answers(cell: dict, names: dict[str, str]) -> list[tuple[str, str]]:
    """(exercise, answer) for each engine answer a getsource call in the cell prints: the answer
    itself, a method of it, or a module or class that holds it."""
    tree = parse_or_none(cell["source"]) if "getsource" in cell["source"] else None
    if tree is None:
        return []
    strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)
               and isinstance(n.value, str) and n.value.isidentifier()}
    targets = [t for n in ast.walk(tree) if isinstance(n, ast.Call)
               and "getsource" in (getattr(n.func, "attr", ""), getattr(n.func, "id", ""))
               and n.args for t in resolve(n.args[0], names, strings)]
    hits = []
    for number, answers in ENGINE_ANSWERS.items():
        for answer in map(dotted, answers):
            if any(t == answer or answer.startswith(t + ".") or t.startswith(answer + ".")
                   for t in targets):
                hits.append((number, answer))
    return hits


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
