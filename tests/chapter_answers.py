"""What a chapter shows, and what an exercise's answer is, as text: the chapter's cells (its
MyST source, with the outputs of its last executed run when that is newer), runs of non-blank
lines, the reference answers' function bodies, the engine's own answers (ENGINE_ANSWERS), and
which `inspect.getsource` calls print one. Used by tests/test_chapter_rules.py; no kernel runs."""

from __future__ import annotations

import ast
import functools
import json
from pathlib import Path

import jupytext

ROOT = Path(__file__).resolve().parent.parent
EXECUTED = ROOT / "_build" / "executed"
SOLUTIONS = sorted((ROOT / "solutions").glob("[0-9][0-9][0-9]_*.py"))
WINDOW = 4  # consecutive non-blank lines that count as showing code

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
