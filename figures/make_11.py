"""The figure of chapter 11: the three DP launch modes side by side, drawn from what each
node's flags resolve to in minivllm's own resolution (node_flags.resolve_node: vLLM 0.33.0's
rules): the API servers, the engines and their DP ranks, which engines each front end reaches
and over ipc or tcp.

    .venv/bin/python figures/make_11.py      writes figures/11_dp_launch_modes.png
"""

from __future__ import annotations

from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt

from drawing import box, save_diagram

HERE = Path(__file__).resolve().parent
SHM, TCP = "#1f4e9c", "#b35900"


def arrow(ax, x0, y0, x1, y1, color, style="-"):
    ax.annotate("", (x1, y1), (x0, y0), arrowprops=dict(arrowstyle="->", lw=1.5, color=color,
                                                        linestyle=style))


def main() -> None:
    draw_dp_modes()


API, ENGINE, NODE = "#dce8f8", "#fdf2e3", "#f4f4f4"
NODE_Y = (3.15, 0.35)  # the bottom of node 0's and node 1's box
NODE_H = 2.4
# each panel: its title and both nodes' `minivllm serve` flags (the model and ports left out)
MODES = [("internal (the default)", ("-dp 4 --nnodes 2 --node-rank 0",
                                     "-dp 4 --nnodes 2 --node-rank 1 --headless")),
         ("hybrid", ("-dp 4 -dpl 2 -dpr 0", "-dp 4 -dpl 2 -dpr 2")),
         ("external", ("-dp 2 -dpl 1 -dpr 0", "-dp 2 -dpl 1 -dpr 1"))]


def resolved(flags: str):
    """(layout, DP size) as `minivllm serve FLAGS` resolves them before it starts anything."""
    from minivllm.entrypoints import serve
    from minivllm.entrypoints.node_flags import resolve_node
    args = serve.make_parser().parse_args(flags.split())
    return resolve_node(args), args.data_parallel_size


def draw_dp_modes() -> None:
    """Three panels of two nodes, drawn from what each node's flags resolve to: its API
    servers, its engines (DP ranks), which engines each node's API servers reach and over what."""
    fig, ax = plt.subplots(figsize=(13, 7.4))
    for p, (title, flags) in enumerate(MODES):
        x0 = 0.2 + 5.0 * p
        nodes = [resolved(f) for f in flags]
        ax.text(x0 + 2.3, 8.05, title, ha="center", fontsize=10, weight="bold")
        for i, f in enumerate(flags):
            ax.text(x0 + 2.3, 7.65 - 0.3 * i, f"node {i}: {f}", ha="center", fontsize=7,
                    family="monospace")
        fronts = [i for i, (layout, _) in enumerate(nodes) if layout.api_servers]
        outside = len(fronts) > 1
        box(ax, x0 + 0.9, 6.2, 2.8, 0.5, "load balancer (outside)" if outside else "clients",
            "#ffffff", 8)
        engine_at = {}
        for i, (layout, _) in enumerate(nodes):
            y = NODE_Y[i]
            box(ax, x0, y, 4.6, NODE_H, "", NODE)
            ax.text(x0 + 0.1, y + NODE_H - 0.25, f"node {i}", fontsize=8, weight="bold")
            api_right = _api_servers(ax, x0, y, layout.api_servers)
            engine_at.update(_engines(ax, x0, y, layout.engines))
        for i, (layout, dp) in enumerate(nodes):
            if layout.api_servers:
                reach = range(dp) if layout.mode == "internal" else layout.engines
                tcp = layout.transport == "tcp"
                for rank in reach:
                    ex, ey = engine_at[rank]
                    arrow(ax, x0 + 2.3, NODE_Y[i] + 1.3, ex, ey, TCP if tcp else SHM,
                          "--" if tcp else "-")
        arrow(ax, x0 + 2.3, 6.2, x0 + 2.3, NODE_Y[0] + 1.8, "black")
        if outside:  # to node 1's API servers, down the gap beside the panel
            ax.plot([x0 + 3.7, x0 + 4.8, x0 + 4.8], [6.45, 6.45, NODE_Y[1] + 1.55],
                    color="black", lw=1.5)
            arrow(ax, x0 + 4.8, NODE_Y[1] + 1.55, api_right + 0.05, NODE_Y[1] + 1.55, "black")
    ax.text(0.2, 0.02, "blue: ipc   orange, dashed: tcp (a front end with an engine on "
            "another node reaches every engine over tcp, its own too)   each API server "
            "(API k) is a client of every engine the arrows reach", fontsize=8)
    save_diagram(fig, ax, (0, 15.2), (-0.1, 8.3), HERE / "11_dp_launch_modes.png")


def _api_servers(ax, x0: float, y: float, count: int) -> float:
    """A node's API server processes, side by side (none: headless); the row's right edge."""
    if not count:
        ax.text(x0 + 2.3, y + 1.55, "headless:\nno API server", ha="center", va="center",
                fontsize=7.5, style="italic")
        return x0 + 2.3
    width = min(1.7, (3.6 - 0.15 * (count - 1)) / count)
    left = x0 + 2.3 - (count * width + 0.15 * (count - 1)) / 2
    for k in range(count):
        box(ax, left + k * (width + 0.15), y + 1.3, width, 0.5,
            f"API {k}" if count > 1 else "API server", API, 7.5)
    return left + count * width + 0.15 * (count - 1)


def _engines(ax, x0: float, y: float, ranks: tuple[int, ...]) -> dict[int, tuple[float, float]]:
    """A node's engine cores, labelled with their DP ranks; where an arrow reaches each."""
    at = {}
    width = 1.9 if len(ranks) > 1 else 2.0
    for k, rank in enumerate(ranks):
        ex = x0 + 0.3 + 2.2 * k if len(ranks) > 1 else x0 + 1.3
        box(ax, ex, y + 0.2, width, 0.55, f"engine {rank}", ENGINE, 8)
        at[rank] = (ex + width / 2, y + 0.75)
    return at


if __name__ == "__main__":
    matplotlib.use("Agg")  # only when run as a script: an importer (a chapter) keeps its backend
    main()
