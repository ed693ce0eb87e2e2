"""Every chapter runs top to bottom in a fresh kernel, in quick mode, and is committed clean."""

import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = sorted((ROOT / "chapters").glob("*.ipynb"))
CELL_TIMEOUT_S = 180  # one cell in quick mode; a hang fails the chapter instead of CI


def code_cells(nb):
    return [c for c in nb.cells if c.cell_type == "code"]


def test_chapters_are_committed_without_outputs():
    dirty = [p.name for p in CHAPTERS
             if any(c.get("outputs") or c.get("execution_count") for c in code_cells(nbformat.read(p, 4)))]
    assert not dirty, f"clear the outputs before committing: {dirty}"


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_chapter_runs(path, monkeypatch):
    monkeypatch.setenv("MINIVLLM_QUICK", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(path, 4)
    # Cells tagged `raises-exception` are meant to fail; nbclient lets them and stops on others.
    client = NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    client.execute()
