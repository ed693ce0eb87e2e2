"""Figure of chapter 03: the engine's two ZMQ channels.

    .venv/bin/python figures/make_03.py      writes figures/03_engine_sockets.png
"""

from __future__ import annotations

from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
from matplotlib.patches import FancyBboxPatch

HERE = Path(__file__).resolve().parent


def box(ax, x, y, w, h, text, color):
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02", fc=color, ec="black"))
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=9)


def arrow(ax, x0, y0, x1, y1, label, dy=0.12):
    ax.annotate("", (x1, y1), (x0, y0), arrowprops=dict(arrowstyle="->", lw=1.5))
    ax.text((x0 + x1) / 2, (y0 + y1) / 2 + dy, label, ha="center", fontsize=8)


def main() -> None:
    fig, ax = plt.subplots(figsize=(9, 4.2))
    box(ax, 0.2, 1.2, 2.2, 2.4, "API server\n(front end)\n\nROUTER  (bind)\nPULL      (bind)", "#dbe9f6")
    for i, y in enumerate((2.7, 0.5)):
        box(ax, 6.2, y, 2.6, 1.3,
            f"engine core, DP rank {i}\nDEALER id=b'\\x0{i}\\x00'\nPUSH", "#fde2c8")
        arrow(ax, 2.45, 3.0 - i * 1.2, 6.15, y + 0.95,
              f"[identity, type byte, msgpack, oob frames...]" if i == 0 else "ADD / ABORT / UTILITY")
        arrow(ax, 6.15, y + 0.3, 2.45, 1.6 + i * 0.3 - 0.2, "EngineCoreOutputs" if i else "",
              dy=-0.2)
    ax.text(4.3, 0.05, "first message on each DEALER: ready (lets the ROUTER route to it)",
            ha="center", fontsize=8, style="italic")
    ax.set_xlim(0, 9)
    ax.set_ylim(0, 4.2)
    ax.axis("off")
    ax.set_title("minivllm's front end <-> engine core sockets (as in vLLM V1)")
    fig.tight_layout()
    fig.savefig(HERE / "03_engine_sockets.png", dpi=110)


if __name__ == "__main__":
    matplotlib.use("Agg")  # only when run as a script: an importer (a chapter) keeps its backend
    main()
