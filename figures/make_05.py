"""Figures of chapter 05: the ring's memory layout, and the schedule that breaks flag order.

    .venv/bin/python figures/make_05.py      writes figures/05_ring_layout.png and
                                             figures/05_flag_order_schedule.png

The schedule is not drawn by hand: it is what the judge's interleaving explorer finds when it
runs exercise 213's known-wrong variant "written flag set before the read flags are cleared".
The chapter imports breaking_schedule() and draw_schedule() to redraw it on the reader's run.
"""

from __future__ import annotations

import importlib.util
import re
import types
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

from minivllm.judge import exercise

HERE = Path(__file__).resolve().parent
WRONG_ORDER = "written flag set before the read flags are cleared"
# The smallest scenario of 213's tests that breaks: 1 reader, 2 chunks, 3 messages.
SCENARIO = dict(n_readers=1, n_chunks=2, n_msgs=3, bound=2)


def _load(name: str, source: str | None = None, path: Path | None = None) -> types.ModuleType:
    if source is not None:
        module = types.ModuleType(name)
        exec(compile(source, f"<{name}>", "exec"), module.__dict__)
        return module
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def ring_variant(name: str = WRONG_ORDER) -> types.ModuleType:
    """Exercise 213's reference solution with one known-wrong variant applied."""
    ex = exercise.find("213")
    variant = next(v for v in ex.variants() if v.name == name)
    return _load("ring_wrong_order", source=variant.apply(ex.solution.read_text()))


def reference_ring() -> types.ModuleType:
    """Exercise 213's reference solution, loaded as a module."""
    return _load("ring_reference", path=exercise.find("213").solution)


def run_scenario(ring: types.ModuleType, **scenario):
    """Run 213's interleaving test scenario on `ring`; returns the explorer's SearchResult."""
    tests = _load("exercise_213_tests", path=exercise.find("213").tests)
    args = {**SCENARIO, **scenario}
    msgs = tests.MESSAGES[:args["n_msgs"]]  # 213's _scenario takes the messages themselves
    return tests._scenario(ring, args["n_readers"], args["n_chunks"], msgs, args["bound"])


def breaking_schedule():
    return run_scenario(ring_variant())


def _style(thread: str, text: str) -> tuple[str, str]:
    if text.startswith("store") and "flag" in text:
        return ("tab:blue" if thread == "writer" else "tab:orange"), "bold"
    if text.startswith(("store", "load")):
        return "dimgray", "normal"
    return "tab:green", "bold"  # a note: wrote / received


def erased_reads(events) -> list[int]:
    """Steps where the writer clears a read flag that a reader had set after the new data was
    published: the read is forgotten, and the reader will take the message again."""
    last_store: dict[str, tuple[str, str]] = {}
    found = []
    for i, e in enumerate(events):
        m = re.match(r"store buf\[(\d+)\] = (\d+)", e.text)
        if not m:
            continue
        offset, value = m.groups()
        before = last_store.get(offset)
        if e.thread == "writer" and value == "0" and before and before[0] != "writer" and before[1] == "1":
            found.append(i)
        last_store[offset] = (e.thread, value)
    return found


def draw_schedule(result, path: Path | None = None):
    """A sequence diagram of the failing run: one column per thread, one row per step."""
    events = result.failure.events
    threads = result.thread_names
    fig, ax = plt.subplots(figsize=(11, 0.28 * len(events) + 1.4))
    for i in erased_reads(events):
        ax.add_patch(Rectangle((0.005, -i - 0.45), 0.48, 0.9, facecolor="#fde0dc", edgecolor="none"))
        ax.text(0.36, -i, "<- erases the read of the\n    message just published", fontsize=7,
                color="tab:red", va="center")
    for i, e in enumerate(events):
        col = threads.index(e.thread)
        color, weight = _style(e.thread, e.text)
        if i == len(events) - 1:
            color = "tab:red"
        text = e.text.replace("   (", "  (")
        ax.text(0.02 + 0.5 * col, -i, f"{i + 1:2d}. {text}", color=color, weight=weight,
                fontsize=7.5, family="monospace", va="center")
    for col, name in enumerate(threads):
        ax.text(0.02 + 0.5 * col, 1.3, name, fontsize=11, weight="bold")
    ax.axvline(0.49, color="lightgray")
    ax.set_xlim(0, 1)
    ax.set_ylim(-len(events), 2)
    ax.axis("off")
    ax.set_title("Flag order broken (written flag set before the read flags are cleared):\n"
                 + result.failure.failure, fontsize=9, loc="left")
    fig.tight_layout()
    if path:
        fig.savefig(path, dpi=110)
    return fig


def draw_layout(path: Path | None = None, n_reader: int = 2, n_chunks: int = 4):
    """Data chunks first, then (1 + n_reader) flag bytes per chunk: vLLM's layout; then the
    waiting byte that only minivllm has (chapter 05, section 4.4)."""
    fig, ax = plt.subplots(figsize=(11, 2.4))
    x = 0.0
    for i in range(n_chunks):
        ax.add_patch(Rectangle((x, 0), 1.6, 1, facecolor="#cfe2f3", edgecolor="black"))
        ax.text(x + 0.8, 0.5, f"chunk {i}\nmax_chunk_bytes", ha="center", va="center", fontsize=8)
        x += 1.6
    for i in range(n_chunks):
        for k in range(1 + n_reader):
            face = "#f4cccc" if k == 0 else "#fff2cc"
            ax.add_patch(Rectangle((x, 0), 0.32, 1, facecolor=face, edgecolor="black"))
            ax.text(x + 0.16, 0.5, "w" if k == 0 else f"r{k - 1}", ha="center", va="center",
                    fontsize=8)
            x += 0.32
        ax.text(x - 0.16 * (1 + n_reader) * 2 / 2, -0.25, f"meta {i}", ha="center", fontsize=8)
    meta_end = x
    ax.add_patch(Rectangle((x, 0), 0.32, 1, facecolor="#d9ead3", edgecolor="black"))
    ax.text(x + 0.16, 0.5, "wt", ha="center", va="center", fontsize=8)
    ax.text(x + 0.16, -0.25, "waiting\n(minivllm)", ha="center", va="top", fontsize=8)
    x += 0.32
    ax.annotate("", xy=(0, 1.25), xytext=(1.6 * n_chunks, 1.25),
                arrowprops=dict(arrowstyle="<->"))
    ax.text(0.8 * n_chunks, 1.4, "data: max_chunks x max_chunk_bytes", ha="center", fontsize=9)
    ax.annotate("", xy=(1.6 * n_chunks, 1.25), xytext=(meta_end, 1.25),
                arrowprops=dict(arrowstyle="<->"))
    ax.text((1.6 * n_chunks + meta_end) / 2, 1.4, "metadata: max_chunks x (1 + n_reader) bytes",
            ha="center", fontsize=9)
    ax.set_xlim(-0.1, x + 0.1)
    ax.set_ylim(-0.7, 1.7)
    ax.axis("off")
    ax.set_title(f"ShmRingBuffer, {n_chunks} chunks, {n_reader} readers: w = written flag, "
                 "rK = read flag of reader K, wt = a reader is about to block (one byte each)",
                 fontsize=9)
    fig.tight_layout()
    if path:
        fig.savefig(path, dpi=110)
    return fig


if __name__ == "__main__":
    matplotlib.use("Agg")  # only when run as a script: an importer (a chapter) keeps its backend
    draw_layout(HERE / "05_ring_layout.png")
    draw_schedule(breaking_schedule(), HERE / "05_flag_order_schedule.png")
    print("wrote", HERE / "05_ring_layout.png", "and", HERE / "05_flag_order_schedule.png")
