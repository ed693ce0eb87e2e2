"""figures/01_processes.png: vLLM's processes for `serve -tp=2` and the two pipes per child."""

from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt

from drawing import box

OUT = Path(__file__).resolve().parent / "01_processes.png"


def arrow(ax, x0, y0, x1, y1, text, color="black"):
    ax.annotate("", (x1, y1), (x0, y0), arrowprops=dict(arrowstyle="->", color=color, lw=1.4))
    ax.text((x0 + x1) / 2, (y0 + y1) / 2 + 0.05, text, ha="center", va="bottom", fontsize=7.5,
            color=color)  # arrows are horizontal: the label sits just above its own


def main() -> None:
    fig, ax = plt.subplots(figsize=(10, 4.2))
    ax.set(xlim=(0, 10), ylim=(0, 4.4))
    ax.axis("off")
    box(ax, 0.2, 1.6, 2.2, 1.2, "API server\nHTTP, tokenize,\ndetokenize", "#dbe9f6")
    box(ax, 3.9, 0.7, 2.0, 3.0, "engine core\nbusy loop:\nschedule, execute", "#fde2c8")
    box(ax, 7.6, 2.7, 2.2, 1.0, "worker 0\nforward pass", "#d9f2d9")
    box(ax, 7.6, 0.7, 2.2, 1.0, "worker 1\nforward pass", "#d9f2d9")
    arrow(ax, 2.4, 2.35, 3.9, 2.35, "requests (ZMQ)")
    arrow(ax, 3.9, 2.0, 2.4, 2.0, "outputs (ZMQ)")
    for y in (3.2, 1.2):  # each worker's pipes run straight across from the engine core
        arrow(ax, 5.9, y + 0.2, 7.6, y + 0.2, "death pipe: b'stop' / EOF", "#b03030")
        arrow(ax, 7.6, y - 0.25, 5.9, y - 0.25, "ready pipe: once", "#2050a0")
    ax.text(5.0, 0.15, "launch(): start child -> wait for ready (timeout) | shutdown(): request -> SIGTERM "
            "-> SIGKILL | parent dies -> EOF -> child exits", ha="center", fontsize=8, style="italic")
    ax.set_title("vllm serve -tp=2: 1 API server + 1 engine core + 2 workers = 4 processes", fontsize=10)
    fig.tight_layout()
    fig.savefig(OUT, dpi=110)
    print("wrote", OUT)


if __name__ == "__main__":
    matplotlib.use("Agg")  # only when run as a script: an importer (a chapter) keeps its backend
    main()
