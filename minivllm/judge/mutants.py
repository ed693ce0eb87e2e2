"""The mutants of a reference solution, with ids that stay put, and the equivalent-mutant lists.

mutmut's operators (libcst) make the mutations; each one is applied alone to the solution's
text, giving a file the judge grades like any learner's answer (no trampolines, no mutmut in
the graded process). A mutant's id is a short hash of the function it is in, the original
line(s) and the mutated line(s), so it survives edits elsewhere in the solution; the n-th
mutant with the same hash gets "-n" (n >= 2).

requirements.md of an exercise lists, one line each, the mutants no README-following caller can
tell from the solution by any input or timing (`## Equivalent mutants`), and those that differ
only in the wording of an error whose text the README leaves open (`## Message-text mutants`):

    - 3fa94c0e: <why no behaviour the README promises tells it apart>

Every other mutant is a survivor until a test kills it. Code the starter gives verbatim (Structs,
helper servers, `setup_*`) carries `# pragma: no mutate block` in the solution: no mutant is made
from it, since the learner does not write it.
"""

from __future__ import annotations

import ast
import difflib
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

EQUIVALENT_HEADING = "## Equivalent mutants"
MESSAGE_HEADING = "## Message-text mutants"
CATEGORIES = {EQUIVALENT_HEADING: "equivalent", MESSAGE_HEADING: "message text"}
_ENTRY = re.compile(r"^- ([0-9a-f]{8}(?:-\d+)?): *(.*)$")
DIFF_CONTEXT = 2


@dataclass
class Mutant:
    id: str
    line: int  # first changed line of the solution, 1-based
    function: str  # qualified name of the def it is in ("" at module level)
    text: str  # the whole mutated file
    diff: str  # unified diff against the solution


def make_mutants(source: str, name: str = "solution.py") -> list[Mutant]:
    """Every mutant of `source` that compiles and differs from it, in source order."""
    import libcst as cst
    from libcst.metadata import WhitespaceInclusivePositionProvider
    from mutmut.mutation.file_mutation import MutationVisitor, mutation_operators
    from mutmut.mutation.pragma_handling import IgnoredCode, PragmaVisitor

    wrapper = cst.MetadataWrapper(cst.parse_module(source))
    pragmas = PragmaVisitor(name)  # `# pragma: no mutate` comments in the solution still hold
    wrapper.visit(pragmas)
    visitor = MutationVisitor(mutation_operators, IgnoredCode(
        pragmas.no_mutate_lines, pragmas.ignore_node_lines, set()))
    module = wrapper.visit(visitor)
    where = wrapper.resolve(WhitespaceInclusivePositionProvider)
    starts = [0]
    for line in source.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    functions = _function_spans(source)
    texts: list[str] = []
    for m in visitor.mutations:
        # the mutated node's code spliced in where the original's was: the same program as
        # mutmut's deep_replace gives (up to the indentation of continuation lines), 100x faster
        span = where[m.original_node]
        text = (source[:starts[span.start.line - 1] + span.start.column]
                + module.code_for_node(m.mutated_node)
                + source[starts[span.end.line - 1] + span.end.column:])
        if text != source and text not in texts and _compiles(text):
            texts.append(text)
    mutants = [_describe(source, text, name, functions) for text in texts]
    mutants.sort(key=lambda m: m.line)
    seen: dict[str, int] = {}
    for m in mutants:
        seen[m.id] = seen.get(m.id, 0) + 1
        if seen[m.id] > 1:
            m.id = f"{m.id}-{seen[m.id]}"
    return mutants


def _compiles(text: str) -> bool:
    try:
        compile(text, "<mutant>", "exec")
        return True
    except SyntaxError:
        return False


def _function_spans(source: str) -> list[tuple[int, int, str]]:
    """(first line, last line, qualified name) of every def, outer ones first."""
    spans: list[tuple[int, int, str]] = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                qual = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    spans.append((child.lineno, child.end_lineno or child.lineno, qual))
                walk(child, qual + ".")
            else:
                walk(child, prefix)
    walk(ast.parse(source), "")
    return spans


def _describe(source: str, text: str, name: str, functions) -> Mutant:
    old, new = source.splitlines(), text.splitlines()
    bare_old, bare_new = [s.strip() for s in old], [s.strip() for s in new]
    removed, added, first = [], [], None
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=bare_old, b=bare_new,
                                                       autojunk=False).get_opcodes():
        if tag != "equal":  # changes of indentation alone are not part of the id
            first = i1 + 1 if first is None else first
            removed += bare_old[i1:i2]
            added += bare_new[j1:j2]
    line = first or 1
    inner = [q for lo, hi, q in functions if lo <= line <= hi]
    function = inner[-1] if inner else ""
    key = "\0".join([function, "\n".join(removed), "\n".join(added)])
    diff = "\n".join(difflib.unified_diff(old, new, f"a/{name}", f"b/{name}",
                                          n=DIFF_CONTEXT, lineterm=""))
    return Mutant(hashlib.sha1(key.encode()).hexdigest()[:8], line, function, text, diff)


def equivalent_mutants(requirements: Path) -> dict[str, str]:
    """{id: why} of the `## Equivalent mutants` section of requirements.md ({} without one)."""
    return {i: why for i, (kind, why) in listed_mutants(requirements).items()
            if kind == "equivalent"}


def listed_mutants(requirements: Path) -> dict[str, tuple[str, str]]:
    """{id: (category, why)} from requirements.md's `## Equivalent mutants` ("equivalent") and
    `## Message-text mutants` ("message text") sections. A line there that is not
    `- <id>: <why>` (or blank), or an id listed twice, raises ValueError naming it."""
    if not requirements.exists():
        return {}
    found: dict[str, tuple[str, str]] = {}
    heading = None
    for number, line in enumerate(requirements.read_text().splitlines(), 1):
        if line.startswith("#"):
            heading = line.strip() if line.strip() in CATEGORIES else None
            continue
        if heading is None or not line.strip():
            continue
        match = _ENTRY.match(line.strip())
        if not match:
            raise ValueError(f"{requirements}:{number}: under '{heading}' each line "
                             f"is '- <8 hex id>: <why>', got: {line.strip()!r}")
        if match[1] in found:
            raise ValueError(f"{requirements}:{number}: mutant {match[1]} is listed twice")
        found[match[1]] = (CATEGORIES[heading], match[2].strip())
    return found
