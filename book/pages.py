"""The book's pages, made from the repository's files: the front page from README.md, a chapter
page from its executed notebook, an exercise page from its statement."""

from __future__ import annotations

import html
import re
import tomllib
from pathlib import Path

import nbformat

from executed import ROOT, RUN_KEY

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
BAR_WIDTH = 20  # characters of a progress bar drawn as text


class BookError(RuntimeError):
    """A build that cannot go on; the message says what to do."""


GLOSSARY = ROOT / "chapters" / "glossary.md"  # a plain MyST page, shown beside the chapters


def exercises() -> list[Path]:
    return sorted(p.parent for p in ROOT.glob("practice/[0-9][0-9][0-9]_*/README.md"))


def readme_section(text: str, heading: str) -> str:
    """The README's `## heading` section, heading included, up to the next `## `."""
    match = re.search(rf"^## {re.escape(heading)}\n.*?(?=^## |\Z)", text, re.M | re.S)
    if not match:
        raise BookError(f"README.md has no '## {heading}' section, which the front page shows: "
                        "restore it or change book/pages.py")
    return match.group(0).rstrip() + "\n"


def link_reading_order(section: str, stems: set[str]) -> str:
    """Chapter names and exercise numbers in the reading-order table become links."""
    folders = {p.name[:3]: p.name for p in exercises()}

    def row(line: str) -> str:
        if not re.match(r"\| \d\d \|", line):
            return line
        cells = line.split(" | ")
        cells[1] = re.sub(r"`(\d\d_\w+)`", lambda m: f"[`{m[1]}`](chapters/{m[1]}.ipynb)"
                          if m[1] in stems else m[0], cells[1], count=1)
        cells[-1] = re.sub(r"\b(\d{3})\b", lambda m: f"[{m[1]}](practice/{folders[m[1]]}/README.md)"
                           if m[1] in folders else m[1], cells[-1])
        return " | ".join(cells)

    linked = "\n".join(row(line) for line in section.splitlines()) + "\n"
    missing = sorted(s for s in stems if f"](chapters/{s}.ipynb)" not in linked)
    if missing:
        raise BookError(f"README.md's reading order has no row for {missing}: add one "
                        "(| NN | `NN_topic`: what it covers | modules | exercises |)")
    return linked


def toctree(caption: str, docs: list[str]) -> str:
    return "```{toctree}\n:hidden:\n:caption: " + caption + "\n\n" + "\n".join(docs) + "\n```\n"


def front_page(chapters: list[Path]) -> str:
    """README's title and opening, where to start, its reading order (linked) and how the judge
    grades."""
    readme = (ROOT / "README.md").read_text()
    opening = readme.split("\n## ", 1)[0].rstrip() + "\n"
    stems = {p.stem for p in chapters}
    parts = [opening,
             "The pages show each chapter with the outputs of one run in quick mode (each page "
             "names the machine); `make chapters` opens them in Jupyter to run on yours.\n",
             readme_section(readme, "Start here"),
             link_reading_order(readme_section(readme, "Reading order"), stems),
             readme_section(readme, "Practice and the judge"),
             toctree("Chapters", [f"chapters/{p.stem}" for p in chapters]),
             toctree("Reference", ["chapters/glossary"]),
             toctree("Practice", [f"practice/{p.name}/README" for p in exercises()])]
    return "\n".join(parts)


def run_note(record: dict) -> str:
    return ("```{note}\nThe outputs on this page come from one run of this notebook in "
            f"{record['mode']} mode (`MINIVLLM_QUICK=1`, shrunken experiments) on "
            f"{record['cpu']}, {record['cores']} cores, on {record['date']}. "
            "Run it yourself (`make chapters`) for your machine's numbers at full size.\n```\n")


def widget_text(state: dict, model_id: str) -> str:
    """A tqdm widget's last state as one text line: label, bar, counts."""
    models = {k: v["state"] for k, v in state.items()}
    parts = []
    for ref in models.get(model_id, {}).get("children", []):
        child = models.get(ref.removeprefix("IPY_MODEL_"), {})
        if "max" in child:
            filled = round(BAR_WIDTH * child["value"] / max(child["max"], 1))
            parts.append("|" + "█" * filled + " " * (BAR_WIDTH - filled) + "|")
        else:
            parts.append(html.unescape(child.get("value", "")).replace("\u2007", " "))
    return " ".join(p for p in parts if p.strip())


def without_widgets(nb: nbformat.NotebookNode) -> None:
    """Progress-bar widgets become their last state as text: a widget needs scripts from a CDN."""
    state = nb.metadata.pop("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if WIDGET_VIEW in data:
                text = widget_text(state, data.pop(WIDGET_VIEW)["model_id"])
                data["text/plain"] = text or data.get("text/plain", "")


def chapter_page(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The executed chapter with a note under its title naming the machine and the mode."""
    record = nb.metadata.get(RUN_KEY)
    if not record:
        raise BookError("an executed chapter carries no run record: delete _build/executed/ "
                        "and build again")
    first = next(c for c in nb.cells if c.cell_type == "markdown")
    title, _, rest = first.source.partition("\n")
    first.source = f"{title}\n\n{run_note(record)}\n{rest}"
    without_widgets(nb)
    return nb


def exercise_page(folder: Path) -> str:
    """The statement, then the judge's commands for this exercise."""
    number = folder.name[:3]
    meta = tomllib.loads((folder / "exercise.toml").read_text())
    starter = f"practice/{folder.name}/{meta['file']}"
    return ((folder / "README.md").read_text().rstrip() + "\n\n## Grade it\n\n"
            f"Edit `{starter}`, then, from the repository's root:\n\n```bash\n"
            f"python judge.py {number}             # grade your file\n"
            f"python judge.py {number} --hint      # a hint\n"
            f"python judge.py {number} --watch     # regrade on every save\n"
            f"python judge.py {number} --solution  # grade the reference answer\n```\n")
