"""Every chapter is a jupytext pair (NN_topic.ipynb + NN_topic.md) in sync, committed without
outputs, and runs top to bottom in a fresh kernel in quick mode with every plot drawn and its
outputs showing what its prose says (tests/chapter_claims.py). A chapter that passes is saved
with its outputs in _build/executed/ for `make book` (book/executed.py)."""

import difflib
import re
import sys
from pathlib import Path

import jupytext
import nbformat
import pytest
from nbclient import NotebookClient

from chapter_claims import ABSENT, CLAIMS
from figure_text import ILLEGIBLE

from minivllm.utils.load_scale import stretched

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "book"))
from executed import save_executed  # noqa: E402  (book/ is no package: the book's tools)
CHAPTER_DIR = ROOT / "chapters"
CHAPTERS = sorted(CHAPTER_DIR.glob("[0-9][0-9]_*.ipynb"))
TEXTS = sorted(CHAPTER_DIR.glob("[0-9][0-9]_*.md"))
CELL_TIMEOUT_S = 180  # one cell in quick mode on an idle machine, stretched with the load
# (utils/load_scale.py): a hang fails the chapter instead of CI, a busy machine does not
# A cell that draws: it calls pyplot or displays a PNG. It must leave an image in its outputs.
PLOTS = re.compile(r"\bplt\.\w+\(|display\(Image\(")
PAIRING = "ipynb,md:myst"  # every notebook's jupytext.formats: the pair, in the file itself
KEPT_METADATA = ("tags",)
# Run first in the test's copy of each chapter: every figure is checked for overlapping text as
# it is rendered (tests/figure_text.py), and a problem is printed for the test to find.
WATCH_FIGURES = (f"import sys\nsys.path.insert(0, {str(ROOT / 'tests')!r})\n"
                 "import figure_text\nfigure_text.watch()")  # cell metadata that changes how a cell runs; the rest is editor state


def code_cells(nb):
    return [c for c in nb.cells if c.cell_type == "code"]


def cell_key(cell) -> tuple:
    meta = {k: cell.metadata[k] for k in KEPT_METADATA if k in cell.metadata}
    return cell.cell_type, cell.source.strip(), repr(sorted(meta.items()))


def pair_difference(ipynb: Path, text: Path) -> str:
    """'' when the two files hold the same cells; otherwise the first difference, in words."""
    nb = nbformat.read(ipynb, 4)
    if nb.metadata.get("kernelspec", {}).get("name") != "python3":
        return f"{ipynb.name} names no python3 kernel: start {text.name} with the header in chapters/README.md"
    if nb.metadata.get("jupytext", {}).get("formats") != PAIRING:
        return (f"{ipynb.name} does not name its pair in its metadata (Jupyter without "
                f"chapters/jupytext.toml would not sync it): run `.venv/bin/jupytext "
                f"--set-formats {PAIRING} chapters/{ipynb.name}`")
    a, b = nb.cells, jupytext.read(text).cells
    for i, (x, y) in enumerate(zip(a, b)):
        if cell_key(x) != cell_key(y):
            sides = (f"{k[0]} {k[2]}\n{k[1]}".splitlines() for k in (cell_key(x), cell_key(y)))
            lines = difflib.unified_diff(*sides, ipynb.name, text.name, lineterm="", n=1)
            return f"cell {i} differs:\n" + "\n".join(list(lines)[:30])
    if len(a) != len(b):
        return f"{ipynb.name} has {len(a)} cells, {text.name} has {len(b)}"
    return ""


def test_every_chapter_is_a_pair():
    stems = {p.stem for p in CHAPTERS} ^ {p.stem for p in TEXTS}
    assert CHAPTERS and not stems, (
        f"unpaired chapter files {sorted(stems)}: run `.venv/bin/jupytext --sync chapters/NN_topic.md` "
        "(or .ipynb) to create the other half (see chapters/README.md)")


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_pair_in_sync(path):
    text = path.with_suffix(".md")
    if not text.exists():
        pytest.skip("unpaired: test_every_chapter_is_a_pair says so")
    diff = pair_difference(path, text)
    assert not diff, f"{diff}\nthe pair is out of sync: run `.venv/bin/jupytext --sync {path.relative_to(ROOT)}`"


def test_chapters_are_committed_without_outputs():
    dirty = [p.name for p in CHAPTERS
             if any(c.get("outputs") or c.get("execution_count") for c in code_cells(nbformat.read(p, 4)))]
    assert not dirty, (f"clear the outputs before committing: {dirty} "
                       "(`.venv/bin/jupyter nbconvert --clear-output --inplace chapters/NN_topic.ipynb`)")


def printed_text(nb) -> str:
    """What the cells printed on stdout, and the name and message of each error a cell raised."""
    parts = []
    for cell in code_cells(nb):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream" and out.get("name") == "stdout":
                parts.append(out.get("text", ""))
            elif out.get("output_type") == "error":
                parts.append(f"{out.get('ename')}: {out.get('evalue')}\n")
    return "".join(parts)


def streamed_text(nb) -> str:
    """Everything the cells wrote on stdout and stderr (a child process's log included)."""
    return "".join(out.get("text", "") for cell in code_cells(nb) for out in cell.get("outputs", [])
                   if out.get("output_type") == "stream")


def unwanted_output(text: str) -> list[str]:
    return [f"{why}: the output shows /{pattern}/" for pattern, why in ABSENT if re.search(pattern, text)]


def unmet_claims(stem: str, text: str) -> list[str]:
    return [f"{why}: no output matches /{pattern}/"
            for pattern, why in CLAIMS.get(stem[:2], []) if not re.search(pattern, text)]


def test_every_chapter_has_claims():
    missing = [p.stem for p in TEXTS if not CLAIMS.get(p.stem[:2])]
    assert not missing, f"add what these chapters' outputs must show to tests/chapter_claims.py: {missing}"


def silent_plots(nb) -> list[str]:
    """The first line of each plotting cell that left no image in its outputs."""
    return [c.source.strip().splitlines()[0] for c in code_cells(nb) if PLOTS.search(c.source)
            and not any("image/png" in o.get("data", {}) for o in c.get("outputs", []))]


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_chapter_runs(path, monkeypatch):
    monkeypatch.setenv("MINIVLLM_QUICK", "1")
    # The kernel draws with Jupyter's inline backend, as a reader's does: a figures module that
    # switched the backend (to Agg) would leave the plotting cells without an image.
    monkeypatch.delenv("MPLBACKEND", raising=False)
    nb = nbformat.read(path, 4)
    nb.cells.insert(0, nbformat.v4.new_code_cell(WATCH_FIGURES))
    # Cells tagged `raises-exception` are meant to fail; nbclient lets them and stops on others.
    client = NotebookClient(nb, timeout=int(stretched(CELL_TIMEOUT_S)), kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    silent = silent_plots(nb)
    assert not silent, f"these plotting cells drew no image: {silent}"
    printed = printed_text(nb)
    illegible = [line for line in printed.splitlines() if line.startswith(ILLEGIBLE)]
    assert not illegible, "move these labels apart:\n" + "\n".join(illegible)
    unwanted = unwanted_output(streamed_text(nb))
    assert not unwanted, "\n".join(unwanted)
    unmet = unmet_claims(path.stem, printed)
    assert not unmet, ("the chapter's outputs do not show what its prose says (tests/chapter_claims.py):\n"
                       + "\n".join(unmet))
    del nb.cells[0]  # the figure watch is the test's, not the chapter's
    save_executed(nb, path)  # `make book` shows these outputs instead of running the chapter again
