"""The figure of chapter 10: multi-node tensor parallelism (the leader's ring keeps its local
reader on shared memory and serves the other nodes' ranks as remote readers over tcp; replies
and the all-reduce of every rank, the leader's too, cross the network).

    .venv/bin/python figures/make_10.py      writes figures/10_across_machines.png
"""

from __future__ import annotations

from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt

from drawing import box, save_diagram

HERE = Path(__file__).resolve().parent
SHM, TCP, COMM = "#1f4e9c", "#b35900", "#2e7d32"


def arrow(ax, x0, y0, x1, y1, color, style="-"):
    ax.annotate("", (x1, y1), (x0, y0), arrowprops=dict(arrowstyle="->", lw=1.5, color=color,
                                                        linestyle=style))


def main() -> None:
    draw_tp_nodes()


def draw_tp_nodes() -> None:
    fig, ax = plt.subplots(figsize=(11, 6.4))
    box(ax, 0.2, 0.15, 4.6, 5.35, "", "#eef3fb")
    ax.text(2.5, 5.05, "node 0 (leader, 10.0.0.1): minivllm serve -tp 3\n--nnodes 3 "
            "--node-rank 0 --master-addr 10.0.0.1", ha="center", fontsize=8.5, weight="bold")
    box(ax, 0.5, 3.7, 4.0, 1.0, "engine core + MultiprocExecutor\nPeerWatch on remote replies",
        "#ffffff", 8)
    box(ax, 0.5, 2.3, 2.4, 0.9, "broadcast MessageQueue\nshm ring + XPUB tcp", "#dce8f8", 8)
    box(ax, 0.5, 0.8, 2.4, 0.9, "Worker_TP0\n(local reader: shm)", "#fdf2e3", 8)
    arrow(ax, 1.7, 3.7, 1.7, 3.2, SHM)
    arrow(ax, 1.2, 2.3, 1.2, 1.7, SHM)
    arrow(ax, 2.9, 1.4, 3.6, 3.7, SHM, "--")
    ax.text(0.5, 0.35, "rank 0's reply: shm (dashed)", fontsize=7, color=SHM)
    for i, y in enumerate((3.4, 0.6), start=1):
        box(ax, 7.3, y, 3.9, 2.0, "", "#f4f4f4")
        ax.text(9.25, y + 1.6, f"node {i}: minivllm serve -tp 3 --nnodes 3\n"
                f"--node-rank {i} --master-addr 10.0.0.1 --headless", ha="center",
                fontsize=7.5, weight="bold")
        box(ax, 7.6, y + 0.3, 3.3, 1.0, f"Worker_TP{i}\nremote reader (SUB, heartbeats)\n"
            "reply MessageQueue (XPUB tcp)", "#fdf2e3", 7.5)
        arrow(ax, 2.9, 2.75, 7.6, y + 1.0, TCP)
        arrow(ax, 7.6, y + 0.5, 4.5, 3.85 + 0.3 * (2 - i), TCP, "--")
    ax.text(4.0, 1.1, "each step: one send per\nremote reader (tcp)", fontsize=7.5, color=TCP)
    ax.text(5.25, 4.55, "replies: tcp", fontsize=7.5, color=TCP)
    # the all-reduce: one gloo group of every TP rank, Worker_TP0 on the leader included
    ax.plot([2.75, 2.75, 11.5, 11.5], [0.8, -0.25, -0.25, 4.4], color=COMM, lw=3)
    for y in (1.4, 4.2):  # Worker_TP2, Worker_TP1
        ax.plot([10.9, 11.5], [y, y], color=COMM, lw=3)
    ax.text(11.6, 2.8, "gloo all-reduce\nof all 3 ranks\n(TP0 too) over\ntcp, 2L+1 a\nstep; "
            "the group\nmeets at\nmaster_addr:\nmaster_port", fontsize=7.5, color=COMM,
            va="center")
    ax.text(0.2, 6.05, "blue: shared memory, inside node 0 only   orange: tcp between nodes "
            "(solid: the broadcast; dashed: replies)   green: the collectives", fontsize=8)
    save_diagram(fig, ax, (0, 13.2), (-0.45, 6.4), HERE / "10_across_machines.png")


if __name__ == "__main__":
    matplotlib.use("Agg")  # only when run as a script: an importer (a chapter) keeps its backend
    main()
