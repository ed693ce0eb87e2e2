"""Every figure the figure scripts draw is legible: no two pieces of text overlap, and no arrow
runs through a label. Each figures/make_NN.py is run as its `__main__` would, with savefig
caught, so the check sees the very figures the PNGs are made from; the renderer gives each
text's box in pixels."""

import importlib
import sys
from pathlib import Path

import matplotlib
import pytest
from figure_text import text_overlaps
from matplotlib.figure import Figure

matplotlib.use("Agg")
FIGURES = Path(__file__).resolve().parent.parent / "figures"
SCRIPTS = sorted(FIGURES.glob("make_[0-9][0-9].py"))


def drawn_figures(module, monkeypatch) -> list[Figure]:
    caught: list[Figure] = []
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: caught.append(fig))
    if module.__name__ == "make_02":
        module.main(quick=True)
    elif module.__name__ == "make_05":
        module.draw_layout("layout")
        module.draw_chunk_format("format")
        module.draw_schedule(module.breaking_schedule(), "schedule")
    else:
        module.main()
    return caught


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_no_text_overlaps(script, monkeypatch):
    monkeypatch.syspath_prepend(str(FIGURES))
    sys.modules.pop(script.stem, None)
    module = importlib.import_module(script.stem)
    figures = drawn_figures(module, monkeypatch)
    assert figures, f"{script.name} drew no figure"
    problems = [f"figure {i}: {p}" for i, fig in enumerate(figures) for p in text_overlaps(fig)]
    assert not problems, (f"{script.name} draws illegible text; move the labels apart:\n"
                          + "\n".join(problems))
