"""Every figure the figure scripts draw is legible: no two pieces of text overlap, and no arrow
runs through a label. Each figures/make_NN.py is run as its `__main__` would, with savefig
caught, so the check sees the very figures the PNGs are made from; the renderer gives each
text's box in pixels."""

import importlib
import sys
from pathlib import Path

import matplotlib
import numpy as np
import pytest
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch
from matplotlib.text import Annotation, Text

matplotlib.use("Agg")
FIGURES = Path(__file__).resolve().parent.parent / "figures"
SCRIPTS = sorted(FIGURES.glob("make_[0-9][0-9].py"))
# Boxes may touch: a pixel of overlap is antialiasing, not a collision.
SLACK_PX = 1.5
ARROW_SAMPLES = 200  # points along each arrow's path checked against every label


def drawn_figures(module, monkeypatch) -> list[Figure]:
    caught: list[Figure] = []
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: caught.append(fig))
    if module.__name__ == "make_02":
        module.main(quick=True)
    elif module.__name__ == "make_05":
        module.draw_layout("layout")
        module.draw_schedule(module.breaking_schedule(), "schedule")
    else:
        module.main()
    return caught


def drawn_texts(fig) -> list[Text]:
    """The texts the renderer draws: tick labels only of the ticks in view, of visible axes."""
    ticks = {id(t) for ax in fig.axes for axis in ax._axis_map.values()
             for tick in axis.get_major_ticks() + axis.get_minor_ticks()
             for t in (tick.label1, tick.label2)}
    texts = [t for t in fig.findobj(Text) if id(t) not in ticks]
    for ax in fig.axes:
        if ax.axison:
            for axis in ax._axis_map.values():
                texts += [t for tick in axis._update_ticks() for t in (tick.label1, tick.label2)]
    return [t for t in texts if t.get_visible() and t.get_text().strip()]


def labels(fig) -> list[tuple[str, object]]:
    renderer = fig.canvas.get_renderer()
    found = []
    for t in drawn_texts(fig):
        box = t.get_window_extent(renderer)
        if box.width > 0 and box.height > 0:
            found.append((t.get_text().replace("\n", " / ")[:50], box))
    return found


def shrunk(box):
    return box.padded(-SLACK_PX)


def text_overlaps(fig) -> list[str]:
    fig.canvas.draw()
    found, boxes = [], labels(fig)
    for i, (a, box_a) in enumerate(boxes):
        for b, box_b in boxes[i + 1:]:
            if shrunk(box_a).overlaps(shrunk(box_b)):
                found.append(f"text {a!r} overlaps text {b!r}")
    arrows = fig.findobj(FancyArrowPatch) + [a.arrow_patch for a in fig.findobj(Annotation)
                                             if a.arrow_patch is not None]
    for arrow in arrows:
        path = arrow.get_path().transformed(arrow.get_transform()).interpolated(ARROW_SAMPLES)
        points = path.vertices[np.isfinite(path.vertices).all(axis=1)]
        for name, box in boxes:
            inner = shrunk(box)
            if any(inner.contains(x, y) for x, y in points):
                found.append(f"an arrow runs through the label {name!r}")
    return found


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
