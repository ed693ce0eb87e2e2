"""Figure of chapter 08: the executor, its broadcast ring, the reply queues, the pipes, and the
workers' all-reduce.

    .venv/bin/python figures/make_08.py      writes figures/08_executor_workers.png
"""

from __future__ import annotations

from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt

from drawing import box, save_diagram

HERE = Path(__file__).resolve().parent
BCAST, REPLY, PIPE, COMM = "#1f4e9c", "#b35900", "#777777", "#2e7d32"


def arrow(ax, x0, y0, x1, y1, color="black", style="-", both=False):
    ax.annotate("", (x1, y1), (x0, y0), arrowprops=dict(
        arrowstyle="<->" if both else "->", lw=1.5, color=color, linestyle=style))


def main() -> None:
    fig, ax = plt.subplots(figsize=(11, 6.2))
    box(ax, 0.2, 2.2, 3.0, 2.6, "", "#eef3fb")
    ax.text(1.7, 4.55, "engine core process", ha="center", fontsize=10, weight="bold")
    box(ax, 0.45, 3.45, 2.5, 0.8, "scheduler -> SchedulerOutput\n(busy loop)", "#ffffff", 8)
    box(ax, 0.45, 2.45, 2.5, 0.8, "MultiprocExecutor\n+ monitor thread (sentinels)", "#ffffff", 8)
    box(ax, 4.1, 3.3, 2.2, 1.1, "broadcast MessageQueue\nshm ring: 1 writer, 3 readers\n"
        "(ExecuteModel | RPCCall)", "#dce8f8", 8)
    for r, y in enumerate((4.9, 2.9, 0.9)):
        box(ax, 7.6, y, 2.9, 1.1, f"WorkerProc rank {r}\nMINIVLLM::Worker_TP{r}\n1/3 of every layer",
            "#fdf2e3", 8)
        arrow(ax, 6.3, 3.85, 7.6, y + 0.65, BCAST)
        box(ax, 4.4, y - 0.55 if r else y + 0.25, 1.7, 0.45, f"reply MQ(1, 1) of rank {r}",
            "#f8e5d0", 7)
        ry = (y - 0.33) if r else (y + 0.47)
        arrow(ax, 7.6, y + 0.3, 6.1, ry, REPLY)
        arrow(ax, 4.4, ry, 2.95, 2.85, REPLY)
    arrow(ax, 2.95, 3.0, 4.1, 3.75, BCAST)
    for y in (4.9, 2.9, 0.9):
        ax.plot([3.2, 7.6], [2.25, y + 0.1], color=PIPE, lw=0.8, linestyle=":")
    ax.text(0.25, 1.6, "ready pipe (reply handle) and\ndeath pipe (b\"stop\" / EOF) per worker",
            fontsize=7.5, color=PIPE)
    ax.plot([10.7, 10.7], [1.45, 5.45], color=COMM, lw=3)
    ax.text(10.8, 3.45, "gloo all-reduce\n(2 per layer)\nand gather of\nthe logits", fontsize=8,
            color=COMM, va="center")
    ax.text(0.2, 6.15, "blue: each step, written once, read by every rank   orange: only the output "
            "rank replies to execute_model; every rank to collective_rpc", fontsize=8)
    save_diagram(fig, ax, (0, 12.2), (0, 6.4), HERE / "08_executor_workers.png")


if __name__ == "__main__":
    matplotlib.use("Agg")  # only when run as a script: an importer (a chapter) keeps its backend
    main()
