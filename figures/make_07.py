"""Figures of chapter 07: the engine core process, its busy loop between two IO threads, and the
client with its death monitor; and vLLM's process layout beside SGLang's.

    .venv/bin/python figures/make_07.py      writes figures/07_engine_core.png and
                                             figures/07_vllm_sglang.png
"""

from __future__ import annotations

from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt

from drawing import box, save_diagram

HERE = Path(__file__).resolve().parent
IN, OUT, DEATH = "#1f4e9c", "#b35900", "#b71c1c"


def arrow(ax, x0, y0, x1, y1, color="black", style="-"):
    ax.annotate("", (x1, y1), (x0, y0),
                arrowprops=dict(arrowstyle="->", lw=1.5, color=color, linestyle=style))


def label(ax, x, y, text, color="black", **kw):
    ax.text(x, y, text, ha="center", fontsize=8, color=color, **kw)


def main() -> None:
    fig, ax = plt.subplots(figsize=(11, 6.2))
    # the front end process
    ax.add_patch(plt.Rectangle((0.1, 0.3), 3.6, 5.4, fc="#f3f7fc", ec="#1f4e9c", lw=1.2))
    label(ax, 1.9, 5.45, "front end process (LLM / AsyncLLM)", weight="bold")
    box(ax, 0.4, 4.2, 3.0, 0.8, "caller: add_request / get_output\n(blocks on the outputs queue)",
        "#dbe9f6")
    box(ax, 0.4, 2.9, 1.4, 0.8, "ROUTER\n(bind)", "#dbe9f6")
    box(ax, 2.0, 2.9, 1.4, 0.8, "output thread\nPULL (bind)", "#dbe9f6")
    box(ax, 0.4, 0.6, 3.0, 1.0, "monitor thread: waits on the\nprocess sentinels (or pidfds)",
        "#f8d7d7")
    # the engine core process
    ax.add_patch(plt.Rectangle((5.0, 0.3), 5.8, 5.4, fc="#fef6ee", ec="#b35900", lw=1.2))
    label(ax, 7.9, 5.45, "engine core process  MINIVLLM::EngineCore_0", weight="bold")
    box(ax, 5.3, 3.9, 1.7, 1.1, "input thread\nDEALER\nid = rank, 2 B LE", "#fde2c8")
    box(ax, 8.8, 3.9, 1.7, 1.1, "output thread\nPUSH\n(reused buffer)", "#fde2c8")
    box(ax, 6.6, 1.9, 2.6, 1.4, "busy loop (main thread)\nblock on input_queue when idle\n"
        "schedule -> execute ->\naborts -> update_from_output", "#fff3c4")
    box(ax, 6.6, 0.6, 2.6, 0.8, "executor -> worker (model)", "#e2f0d9")
    # arrows: requests
    arrow(ax, 1.1, 3.72, 5.25, 4.4, IN)  # from the ROUTER's top, over the PULL box
    label(ax, 4.35, 4.5, "[id, type, msgpack, oob...]", IN)
    arrow(ax, 6.1, 3.85, 6.9, 3.35, IN)
    label(ax, 5.7, 3.25, "input_queue\n(+aborts_queue)", IN)
    # outputs
    arrow(ax, 8.9, 3.35, 9.6, 3.85, OUT)
    label(ax, 9.85, 3.45, "output_queue", OUT)
    arrow(ax, 8.75, 3.95, 3.45, 3.3, OUT)  # to the PULL box's right edge
    label(ax, 4.35, 2.45, "EngineCoreOutputs (token lists)\nor ENGINE_CORE_DEAD", OUT)
    arrow(ax, 7.9, 1.85, 7.9, 1.45)
    # death
    arrow(ax, 5.0, 1.1, 3.45, 1.1, DEATH, "--")
    label(ax, 4.25, 1.25, "exit / kill -9", DEATH)
    arrow(ax, 1.9, 1.65, 1.9, 4.15, DEATH, "--")
    label(ax, 1.0, 2.2, "EngineDeadError\nto every caller", DEATH)
    save_diagram(fig, ax, (0, 11), (0, 5.9), HERE / "07_engine_core.png",
                 "Chapter 07: the engine core in its own process")


def _down(ax, x, y0, y1, text, side="left"):
    """A vertical arrow with its label beside it, never across it."""
    arrow(ax, x, y0, x, y1)
    dx, ha = (0.2, "left") if side == "left" else (-0.2, "right")
    ax.text(x + dx, (y0 + y1) / 2, text, ha=ha, va="center", fontsize=8)


def _vllm(ax) -> None:
    box(ax, 1, 6, 8, 1.4, "API server process\nHTTP, tokenize, detokenize (OutputProcessor)",
        "#dbe9f6")
    box(ax, 1, 3.5, 8, 1.4, "engine core process  VLLM::EngineCore\nscheduler, busy loop",
        "#fde2c8")
    box(ax, 0.5, 0.4, 3.6, 1.4, "worker TP0\nmodel shard, sampler", "#e2f0d9")
    box(ax, 5.9, 0.4, 3.6, 1.4, "worker TP1\nmodel shard, sampler", "#e2f0d9")
    _down(ax, 2, 6, 4.9, "requests: ZMQ ROUTER, ipc://")
    _down(ax, 6, 4.9, 6, "outputs: token ids, ZMQ PUSH")
    arrow(ax, 2.3, 3.5, 2.3, 1.8)
    arrow(ax, 7.7, 3.5, 7.7, 1.8)
    ax.text(5, 2.65, "each step: shared-memory ring\n(MessageQueue); TP0 replies", ha="center",
            va="center", fontsize=8)
    ax.set_title("vLLM 0.33.0, serve -tp 2", fontsize=10)


def _sglang(ax) -> None:
    box(ax, 1, 6, 8, 1.4, "HTTP process with the TokenizerManager\nHTTP, tokenize", "#dbe9f6")
    box(ax, 0.5, 3.5, 3.5, 1.4, "Scheduler TP0\nschedule + model shard", "#fde2c8")
    box(ax, 6, 3.5, 3.5, 1.4, "DetokenizerManager\nbatch detokenize", "#f8d7d7")
    box(ax, 0.5, 0.4, 3.5, 1.4, "Scheduler TP1\nschedule + model shard", "#fde2c8")
    _down(ax, 1.3, 6, 4.9, "requests:\nZMQ PUSH")
    _down(ax, 3.3, 4.9, 6, "control replies,\naborts: ZMQ PUSH")
    _down(ax, 8, 4.9, 6, "text:\nZMQ PUSH", side="right")
    arrow(ax, 4.0, 4.2, 6.0, 4.2)
    ax.text(5, 4.3, "token ids\n(PUSH)", ha="center", va="bottom", fontsize=8)
    _down(ax, 2.25, 3.5, 1.8, "every request: broadcast_pyobj\n(torch.distributed, CPU group)")
    ax.set_title("SGLang 0.5.23, launch_server --tp 2", fontsize=10)


def draw_layouts(path: Path | None = None):
    """vLLM's processes beside SGLang's for two TP ranks: who tokenizes, schedules, detokenizes."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    for ax, draw in zip(axes, (_vllm, _sglang)):
        draw(ax)
        ax.set_xlim(0, 10)
        ax.set_ylim(0, 7.6)
        ax.axis("off")
    fig.suptitle("The same serving job, cut into processes two ways (arrows: ZMQ ipc://, "
                 "shared memory or torch.distributed)", fontsize=11)
    fig.tight_layout()
    if path:
        fig.savefig(path, dpi=110)
    return fig


if __name__ == "__main__":
    matplotlib.use("Agg")  # only when run as a script: an importer (a chapter) keeps its backend
    main()
    draw_layouts(HERE / "07_vllm_sglang.png")
