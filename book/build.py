"""`make book`: the handbook as a static website in _build/book/.

Lays out _build/book_src/ from the repository (the README's reading order as the front page, the
executed chapters, the glossary, the figures, the exercises' statements with how to grade them)
and builds it with Sphinx; a warning (a broken reference, a missing image, an unknown directive)
fails the build. Chapters come from _build/executed/ (book/executed.py): the test suite's runs
when they are newer than the chapter, otherwise executed here in quick mode.

    .venv/bin/python book/build.py [--no-execute]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat

from executed import ROOT, chapters, execute, executed_path, is_fresh, save_executed
from pages import GLOSSARY, BookError, chapter_page, exercise_page, exercises, front_page

SOURCE_DIR = ROOT / "_build" / "book_src"
SITE_DIR = ROOT / "_build" / "book"


def ensure_executed(paths: list[Path], may_execute: bool) -> None:
    """One line per chapter: reused from an earlier run, or executed now."""
    for i, chapter in enumerate(paths, 1):
        head = f"[{i}/{len(paths)}] {chapter.stem}:"
        if is_fresh(chapter):
            print(f"{head} outputs of an earlier run ({executed_path(chapter).relative_to(ROOT)})")
            continue
        if not may_execute:
            raise BookError(f"{head} no executed notebook newer than the chapter: run "
                            f"`python -m pytest tests/test_chapters.py -k {chapter.stem}` "
                            "or build without --no-execute")
        print(f"{head} executing in quick mode", flush=True)
        start = time.monotonic()
        try:
            save_executed(execute(chapter), chapter)
        except Exception as exc:  # a cell failed: name the chapter, keep the kernel's message
            raise BookError(f"{chapter.name} failed to run; run its test for the details "
                            f"(`python -m pytest -q tests/test_chapters.py -k {chapter.stem}`):"
                            f"\n{exc}") from exc
        print(f"{head} executed in {time.monotonic() - start:.0f} s", flush=True)


def lay_out(paths: list[Path]) -> None:
    """_build/book_src/: the pages Sphinx reads, at the same relative paths as in the repo."""
    shutil.rmtree(SOURCE_DIR, ignore_errors=True)
    (SOURCE_DIR / "chapters").mkdir(parents=True)
    shutil.copytree(ROOT / "figures", SOURCE_DIR / "figures",
                    ignore=shutil.ignore_patterns("*.py", "*.md", "__pycache__"))
    for chapter in paths:
        nb = chapter_page(nbformat.read(executed_path(chapter), 4))
        nbformat.write(nb, SOURCE_DIR / "chapters" / chapter.name)
    shutil.copy(GLOSSARY, SOURCE_DIR / "chapters" / GLOSSARY.name)
    for folder in exercises():
        target = SOURCE_DIR / "practice" / folder.name / "README.md"
        target.parent.mkdir(parents=True)
        target.write_text(exercise_page(folder))
    (SOURCE_DIR / "index.md").write_text(front_page(paths))


def sphinx_build() -> None:
    """Sphinx with warnings as errors; each warning is printed before the build fails."""
    shutil.rmtree(SITE_DIR, ignore_errors=True)
    cmd = [sys.executable, "-m", "sphinx", "-b", "html", "-W", "--keep-going", "-q",
           "-c", str(ROOT / "book"), str(SOURCE_DIR), str(SITE_DIR)]
    if subprocess.run(cmd, cwd=ROOT).returncode != 0:
        raise BookError("Sphinx reported the warnings above; fix them in the chapter or page "
                        "they name (the paths are under _build/book_src/, laid out from the repo)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-execute", action="store_true",
                        help="fail instead of executing a chapter that has no fresh run")
    args = parser.parse_args(argv)
    paths = chapters()
    start = time.monotonic()
    try:
        ensure_executed(paths, may_execute=not args.no_execute)
        lay_out(paths)
        sphinx_build()
    except BookError as exc:
        print(f"make book: {exc}", file=sys.stderr)
        return 1
    site = SITE_DIR.relative_to(ROOT)
    print(f"the book is in {site}/ ({time.monotonic() - start:.0f} s): open {site}/index.html, "
          f"or serve it with `python -m http.server -d {site} 8001` and open http://127.0.0.1:8001/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
