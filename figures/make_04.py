"""Figure of chapter 04: one message as frames, small arrays inline, large ones out of band.

    .venv/bin/python figures/make_04.py      writes figures/04_frames.png
"""

from __future__ import annotations

from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

from drawing import save_diagram

HERE = Path(__file__).resolve().parent


def main() -> None:
    fig, ax = plt.subplots(figsize=(9, 3.6))
    parts = [("request_id\n'req-7'", 1.3, "#eeeeee"), ("sampling\nparams", 1.2, "#eeeeee"),
             ("ext 2:\n['<i4', [2000], 1]", 1.9, "#fde2c8"), ("ext 1: 12 B\ninline ids", 1.6, "#d8f0d8")]
    x = 0.2
    ax.text(0.2, 3.1, "frame 0: msgpack body (array_like Struct: values only)", fontsize=9)
    for text, w, color in parts:
        ax.add_patch(Rectangle((x, 2.0), w, 0.9, fc=color, ec="black"))
        ax.text(x + w / 2, 2.45, text, ha="center", va="center", fontsize=8)
        x += w
    ax.add_patch(Rectangle((3.0, 0.3), 5.6, 0.9, fc="#fde2c8", ec="black"))
    ax.text(5.8, 0.75, "frame 1: 8,000 raw bytes of prompt_token_ids (int32)\n"
            "sender: a view of the array; receiver: np.frombuffer(frame)", ha="center",
            va="center", fontsize=8)
    ax.annotate("", (4.5, 1.22), (3.6, 1.98), arrowprops=dict(arrowstyle="->", lw=1.5))
    ax.text(6.1, 1.55, ">= 256 B: out of band, never copied into the body", fontsize=8)
    save_diagram(fig, ax, (0, 9), (0, 3.5), HERE / "04_frames.png")


if __name__ == "__main__":
    matplotlib.use("Agg")  # only when run as a script: an importer (a chapter) keeps its backend
    main()
