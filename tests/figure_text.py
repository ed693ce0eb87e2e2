"""Is a matplotlib figure legible? No two drawn texts overlap, and no arrow runs through a label.

tests/test_figures.py checks the figures/make_*.py figures with text_overlaps(); the chapter
test calls watch() in each chapter's kernel, so every figure a chapter draws is checked as it is
rendered, and a problem is printed as a line starting with ILLEGIBLE.
"""

import numpy as np
from matplotlib.backend_bases import FigureCanvasBase
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.patches import FancyArrowPatch
from matplotlib.text import Annotation, Text

# Boxes may touch: half a pixel of overlap is antialiasing, not a collision.
SLACK_PX = 0.5
ARROW_SAMPLES = 200  # points along each arrow's path checked against every label
ILLEGIBLE = "ILLEGIBLE FIGURE"


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


def one_line(text: str) -> str:
    """A text of several lines on one, as a problem line names it."""
    return text.replace("\n", " / ")


def labels(fig) -> list[tuple[str, object]]:
    renderer = fig.canvas.get_renderer()
    found = []
    for t in drawn_texts(fig):
        box = t.get_window_extent(renderer)
        if box.width > 0 and box.height > 0:
            found.append((one_line(t.get_text())[:50], box))
    return found


def shrunk(box):
    return box.padded(-SLACK_PX)


def text_overlaps(fig) -> list[str]:
    if not hasattr(fig.canvas, "get_renderer"):  # a bare Figure(), made without pyplot
        FigureCanvasAgg(fig)
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


def watch() -> None:
    """Check every figure when it is rendered (plt.show, inline display, savefig)."""
    original = FigureCanvasBase.print_figure

    def checked(canvas, *args, **kwargs):
        title = canvas.figure.get_suptitle() or next(
            (ax.get_title() for ax in canvas.figure.axes if ax.get_title()), "untitled")
        for problem in text_overlaps(canvas.figure):
            print(f"{ILLEGIBLE} ({one_line(title)[:90]}): {problem}")
        return original(canvas, *args, **kwargs)

    FigureCanvasBase.print_figure = checked
