"""Figures of chapter 10: multi-node tensor parallelism (the leader's ring keeps its local
reader on shared memory and serves the other nodes' ranks as remote readers over tcp; replies
and the all-reduce cross the network too), and the three DP launch modes side by side (who
runs API servers, which engines each one reaches, where the load balancer sits).

    .venv/bin/python figures/make_10.py      writes figures/10_across_machines.png and
                                             figures/10_dp_launch_modes.png
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
    draw_dp_modes()


def draw_tp_nodes() -> None:
    fig, ax = plt.subplots(figsize=(11, 6.4))
    box(ax, 0.2, 0.15, 4.6, 5.35, "", "#eef3fb")
    ax.text(2.5, 5.15, "node 0 (leader): minivllm serve --nnodes 3", ha="center", fontsize=9,
            weight="bold")
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
        ax.text(9.25, y + 1.65, f"node {i}: serve --headless --node-rank {i}", ha="center",
                fontsize=8.5, weight="bold")
        box(ax, 7.6, y + 0.3, 3.3, 1.0, f"Worker_TP{i}\nremote reader (SUB, heartbeats)\n"
            "reply MessageQueue (XPUB tcp)", "#fdf2e3", 7.5)
        arrow(ax, 2.9, 2.75, 7.6, y + 1.0, TCP)
        arrow(ax, 7.6, y + 0.5, 4.5, 3.85 + 0.3 * (2 - i), TCP, "--")
    ax.text(4.0, 1.1, "each step: one send per\nremote reader (tcp)", fontsize=7.5, color=TCP)
    ax.text(5.25, 4.55, "replies: tcp", fontsize=7.5, color=TCP)
    ax.plot([11.5, 11.5], [0.8, 5.2], color=COMM, lw=3)
    ax.text(11.6, 3.0, "gloo all-reduce\nover tcp, 2L+1\na step; the group\nmeets at\n"
            "master_addr:\nmaster_port", fontsize=7.5, color=COMM, va="center")
    ax.text(0.2, 6.05, "blue: shared memory, inside node 0 only   orange: tcp between nodes "
            "(solid: the broadcast; dashed: replies)   green: the collectives", fontsize=8)
    save_diagram(fig, ax, (0, 13.2), (0, 6.4), HERE / "10_across_machines.png")


API, ENGINE, NODE = "#dce8f8", "#fdf2e3", "#f4f4f4"
NODE_Y = (3.05, 0.35)  # the bottom of node 0's and node 1's box
# (title, flags, load balancer outside?, engines per node)
MODES = [("internal (the default)", "node 1: --headless -dpr 2", False, 2),
         ("hybrid", "-dpl 2, -dpr 0 | -dpr 2", True, 2),
         ("external", "-dpe (or -dpn R)", True, 1)]


def draw_dp_modes() -> None:
    """Three panels: two nodes each, their API servers and DP engines, the arrows requests take."""
    fig, ax = plt.subplots(figsize=(13, 6.2))
    for p, (title, flags, outside, per_node) in enumerate(MODES):
        x0 = 0.2 + 5.0 * p
        ax.text(x0 + 2.3, 6.75, title, ha="center", fontsize=10, weight="bold")
        ax.text(x0 + 2.3, 6.35, flags, ha="center", fontsize=8, family="monospace")
        box(ax, x0 + 0.9, 5.35, 2.8, 0.55, "load balancer (outside)" if outside else "clients",
            "#ffffff", 8)
        for node, y in enumerate(NODE_Y):
            box(ax, x0, y, 4.6, 2.25, "", NODE)
            ax.text(x0 + 0.1, y + 2.0, f"node {node}", fontsize=8, weight="bold")
            if node == 0 or outside:
                box(ax, x0 + 1.1, y + 1.15, 2.4, 0.55, "API server", API, 8)
            for k in range(per_node):
                ex = x0 + 0.3 + 2.2 * k if per_node == 2 else x0 + 1.3
                box(ax, ex, y + 0.2, 1.9 if per_node == 2 else 2.0, 0.55,
                    f"engine {node * per_node + k}", ENGINE, 8)
        arrow(ax, x0 + 2.3, 5.35, x0 + 2.3, NODE_Y[0] + 1.7, "black")
        if outside:  # to node 1's API server, down the gap beside the panel
            ax.plot([x0 + 3.7, x0 + 4.8, x0 + 4.8], [5.62, 5.62, 1.78], color="black", lw=1.5)
            arrow(ax, x0 + 4.8, 1.78, x0 + 3.5, 1.78, "black")
        for node in (0, 1) if outside else (0,):
            _engine_arrows(ax, x0, NODE_Y[node], per_node)
        if not outside:  # internal: node 0's API server reaches node 1's engines over tcp
            arrow(ax, x0 + 2.25, NODE_Y[0] + 1.15, x0 + 1.9, NODE_Y[1] + 0.75, TCP, "--")
            arrow(ax, x0 + 2.45, NODE_Y[0] + 1.15, x0 + 2.7, NODE_Y[1] + 0.75, TCP, "--")
    ax.text(0.2, 0.02, "blue: ipc inside a node   orange, dashed: tcp to another node's "
            "engines (internal mode only)", fontsize=8)
    save_diagram(fig, ax, (0, 15.2), (-0.1, 7.0), HERE / "10_dp_launch_modes.png")


def _engine_arrows(ax, x0: float, y: float, per_node: int) -> None:
    """From a node's API server down to its own engines."""
    if per_node == 1:
        arrow(ax, x0 + 2.3, y + 1.15, x0 + 2.3, y + 0.75, SHM)
        return
    arrow(ax, x0 + 1.6, y + 1.15, x0 + 1.25, y + 0.75, SHM)
    arrow(ax, x0 + 3.0, y + 1.15, x0 + 3.45, y + 0.75, SHM)


if __name__ == "__main__":
    matplotlib.use("Agg")  # only when run as a script: an importer (a chapter) keeps its backend
    main()
