"""Figure of chapter 03: vLLM V1's two engine channels, which minivllm has too, and vLLM's DP
coordinator with its sockets, which minivllm does not run.

    .venv/bin/python figures/make_03.py      writes figures/03_engine_sockets.png
"""

from __future__ import annotations

from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt

from drawing import box, save_diagram

HERE = Path(__file__).resolve().parent


def arrow(ax, x0, y0, x1, y1, color="black", style="-"):
    ax.annotate("", (x1, y1), (x0, y0), arrowprops=dict(arrowstyle="->", lw=1.5, color=color, linestyle=style))


def label(ax, x, y, text, color="black", **kw):
    ax.text(x, y, text, ha="center", fontsize=8, color=color, **kw)


IN, OUT, COORD = "#1f4e9c", "#b35900", "#2e7d32"  # input channel, output channel, coordinator


def main() -> None:
    fig, ax = plt.subplots(figsize=(10, 6.0))
    box(ax, 0.1, 1.9, 2.4, 2.9, "API server\n(front end)\n\nROUTER  (bind)\n\nPULL      (bind)\n\n"
        "XSUB  (stats, vLLM)", "#dbe9f6")
    for i, y in enumerate((3.7, 1.7)):
        box(ax, 7.0, y, 2.9, 1.4, f"engine core, DP rank {i}\nDEALER id=b'\\x0{i}\\x00'\n"
            "PUSH\nXSUB  (waves, vLLM)", "#fde2c8")
    # input: the application hands the ROUTER the identity frame; the DEALER never sees it
    arrow(ax, 2.55, 4.45, 6.95, 4.75, IN)
    arrow(ax, 2.55, 4.3, 6.95, 2.85, IN)
    label(ax, 4.75, 5.3, "ROUTER is given [identity, type byte, msgpack, oob frames...]", IN)
    label(ax, 4.75, 5.12, "DEALER receives [type byte, msgpack, oob frames...]:", IN, style="italic")
    label(ax, 4.75, 4.96, "the ROUTER uses the identity to pick the pipe, and strips it", IN, style="italic")
    # output: every engine's PUSH into the one PULL
    arrow(ax, 6.95, 3.9, 2.55, 3.35, OUT)
    arrow(ax, 6.95, 2.0, 2.55, 3.2, OUT)
    label(ax, 4.1, 2.05, "EngineCoreOutputs over PUSH -> PULL\n(fair-queued; each names its engine_index)", OUT)
    # vLLM's DP coordinator (DP > 1); minivllm runs none
    box(ax, 3.5, 0.15, 2.9, 1.1, "vLLM's DP coordinator (DP > 1)\nXPUB (front)   PULL   XPUB (back)",
        "#e2f0d9")
    arrow(ax, 3.5, 0.8, 1.3, 1.85, COORD, "--")  # front XPUB -> the front end's XSUB
    label(ax, 2.0, 0.95, "queue lengths", COORD)
    arrow(ax, 7.6, 1.65, 6.4, 1.0, COORD, "--")  # each engine -> the coordinator's PULL
    label(ax, 6.75, 1.45, "stats", COORD)
    arrow(ax, 6.4, 0.45, 9.2, 1.65, COORD, "--")  # back XPUB -> the engines' XSUB
    label(ax, 8.6, 0.7, "START_DP_WAVE", COORD)
    label(ax, 5.0, 5.75, "first message on each DEALER: ready (lets the ROUTER route to it); XSUB peers send "
          "b'\\x01' to subscribe, and the coordinator waits for all", style="italic")
    save_diagram(fig, ax, (0, 10), (0, 6.0), HERE / "03_engine_sockets.png",
                 "vLLM V1's front end <-> engine core sockets (minivllm: all but the DP coordinator's)")


if __name__ == "__main__":
    matplotlib.use("Agg")  # only when run as a script: an importer (a chapter) keeps its backend
    main()
