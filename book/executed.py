"""Executed chapters, kept for the book: each chapter run top to bottom in quick mode, saved with
its outputs in _build/executed/ (ignored by git) together with a record of the machine and mode
that produced them. tests/test_chapters.py saves each chapter it runs and passes; `make book`
uses those that are newer than their chapter and executes only the missing or stale ones."""

from __future__ import annotations

import datetime
import os
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from minivllm.bench.common import cpu_model

ROOT = Path(__file__).resolve().parent.parent
CHAPTER_DIR = ROOT / "chapters"
EXECUTED_DIR = ROOT / "_build" / "executed"
CELL_TIMEOUT_S = 180  # one cell in quick mode, as tests/test_chapters.py: a hang fails the chapter
RUN_KEY = "minivllm_run"  # notebook metadata: where and how the outputs were produced


def chapters() -> list[Path]:
    return sorted(CHAPTER_DIR.glob("[0-9][0-9]_*.ipynb"))


def executed_path(chapter: Path) -> Path:
    return EXECUTED_DIR / chapter.name


def is_fresh(chapter: Path) -> bool:
    """True when the saved run is newer than both halves of the chapter's pair."""
    saved = executed_path(chapter)
    if not saved.exists():
        return False
    sources = [chapter, chapter.with_suffix(".md")]
    return all(saved.stat().st_mtime > s.stat().st_mtime for s in sources if s.exists())


def run_record(mode: str = "quick") -> dict:
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "mode": mode,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}


def save_executed(nb: nbformat.NotebookNode, chapter: Path) -> Path:
    """Write an executed chapter for the book (atomically: a reader never sees half a file)."""
    nb.metadata[RUN_KEY] = run_record()
    EXECUTED_DIR.mkdir(parents=True, exist_ok=True)
    target = executed_path(chapter)
    partial = target.with_suffix(".partial")
    nbformat.write(nb, partial)
    partial.replace(target)
    return target


def execute(chapter: Path) -> nbformat.NotebookNode:
    """Run a chapter in a fresh kernel in quick mode, with Jupyter's inline plots."""
    os.environ["MINIVLLM_QUICK"] = "1"
    os.environ.pop("MPLBACKEND", None)
    nb = nbformat.read(chapter, 4)
    NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                   resources={"metadata": {"path": str(chapter.parent)}}).execute()
    return nb
