"""Exercises on disk: practice/NNN_topic/ with exercise.toml, and solutions/NNN_topic.py.

exercise.toml:
    title = "Shared-memory broadcast ring buffer"
    chapter = "05"
    file = "ring_buffer.py"        # the starter the learner edits, inside the folder
    requires = []                  # capabilities for the whole exercise, e.g. ["cuda"]

variants.toml (known-wrong versions of the solution, each a list of text patches):
    [[variant]]
    name = "written flag set before the read flags are cleared"
    test = "interleavings"         # the test that must be the first to fail
    kind = "fail"                  # fail | timeout | leak | error | todo
    contains = "received"          # optional: text the failure message must hold
    [[variant.patch]]
    old = "..."                    # must occur exactly once in the solution
    new = "..."
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRACTICE = ROOT / "practice"
SOLUTIONS = ROOT / "solutions"


@dataclass
class Variant:
    name: str
    test: str
    kind: str
    contains: str
    patches: list[tuple[str, str]]

    def apply(self, source: str) -> str:
        for old, new in self.patches:
            count = source.count(old)
            if count != 1:
                raise ValueError(f"variant {self.name!r}: patch text occurs {count} times in the "
                                 f"solution, expected once:\n{old}")
            source = source.replace(old, new)
        return source


@dataclass
class Exercise:
    number: str
    folder: Path
    title: str
    chapter: str
    file: str
    requires: tuple[str, ...]

    @property
    def starter(self) -> Path:
        return self.folder / self.file

    @property
    def solution(self) -> Path:
        return SOLUTIONS / f"{self.folder.name}.py"

    @property
    def tests(self) -> Path:
        return self.folder / "tests.py"

    @property
    def module_name(self) -> str:
        return Path(self.file).stem

    def hint(self) -> str:
        path = self.folder / "hint.md"
        return path.read_text() if path.exists() else "(this exercise has no hint yet)"

    def variants(self) -> list[Variant]:
        path = self.folder / "variants.toml"
        if not path.exists():
            return []
        data = tomllib.loads(path.read_text())
        return [Variant(v["name"], v["test"], v.get("kind", "fail"), v.get("contains", ""),
                        [(p["old"], p["new"]) for p in v.get("patch", [])])
                for v in data.get("variant", [])]


def load(folder: Path) -> Exercise:
    meta = tomllib.loads((folder / "exercise.toml").read_text())
    return Exercise(folder.name.split("_", 1)[0], folder, meta["title"], str(meta["chapter"]),
                    meta["file"], tuple(meta.get("requires", ())))


def all_exercises() -> list[Exercise]:
    folders = sorted(p for p in PRACTICE.glob("[0-9][0-9][0-9]_*") if (p / "exercise.toml").exists())
    return [load(p) for p in folders]


def find(number: str) -> Exercise:
    for ex in all_exercises():
        if ex.number == number.zfill(3):
            return ex
    known = ", ".join(e.number for e in all_exercises())
    raise SystemExit(f"no exercise {number}; the exercises are: {known}")
