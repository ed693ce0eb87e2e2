"""Writes a chapter notebook the same way every time: no outputs, and stable cell ids
(`NN-cell-KK`), so regenerating a chapter changes only the cells whose text changed."""

from pathlib import Path

import nbformat
from nbformat.v4 import new_notebook

KERNEL = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}


def write_notebook(cells: list, out: Path) -> None:
    prefix = Path(out).stem.split("_", 1)[0]
    for i, cell in enumerate(cells):
        cell["id"] = f"{prefix}-cell-{i:02d}"
    nbformat.write(new_notebook(cells=cells, metadata=KERNEL), out)
    print("wrote", out)
