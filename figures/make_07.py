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
    # the front end process: requests leave through the ROUTER, outputs come back through the
    # PULL to the caller, and the monitor turns a death into an error for every caller
    ax.add_patch(plt.Rectangle((0.1, 0.3), 3.6, 5.4, fc="#f3f7fc", ec="#1f4e9c", lw=1.2))
    label(ax, 1.9, 5.45, "front end process (LLM / AsyncLLM)", weight="bold")
    box(ax, 2.0, 4.3, 1.4, 0.8, "output thread\nPULL (bind)", "#dbe9f6")
    box(ax, 0.4, 2.9, 3.0, 0.9, "caller: add_request / get_output\n(get_output blocks on\n"
        "the outputs queue)", "#dbe9f6", 8)
    box(ax, 2.0, 1.75, 1.4, 0.75, "ROUTER\n(bind)", "#dbe9f6")
    box(ax, 0.4, 0.5, 3.0, 0.9, "monitor thread: waits on the\nprocess sentinels (or pidfds)",
        "#f8d7d7")
    arrow(ax, 2.7, 4.27, 2.7, 3.83, OUT)
    ax.text(2.6, 4.05, "outputs queue", ha="right", va="center", fontsize=8, color=OUT)
    arrow(ax, 2.7, 2.87, 2.7, 2.53, IN)
    ax.text(2.6, 2.68, "ADD / ABORT", ha="right", va="center", fontsize=8, color=IN)
    # the engine core process
    ax.add_patch(plt.Rectangle((5.0, 0.3), 5.8, 5.4, fc="#fef6ee", ec="#b35900", lw=1.2))
    label(ax, 7.9, 5.45, "engine core process  MINIVLLM::EngineCore_0", weight="bold")
    box(ax, 5.3, 4.1, 1.9, 1.0, "output thread\nPUSH\n(reused buffer)", "#fde2c8")
    box(ax, 5.3, 1.6, 1.9, 1.0, "input thread\nDEALER\nid = rank, 2 B LE", "#fde2c8")
    box(ax, 7.9, 2.6, 2.7, 1.4, "busy loop (main thread)\nblock on input_queue when idle\n"
        "schedule -> execute ->\naborts -> update_from_output", "#fff3c4", 8)
    box(ax, 7.9, 0.6, 2.7, 0.8, "executor -> worker (model)", "#e2f0d9")
    # requests: ROUTER -> DEALER -> input_queue -> busy loop
    arrow(ax, 3.45, 2.12, 5.25, 2.12, IN)
    label(ax, 4.3, 2.25, "[id, type,\nmsgpack, oob...]", IN)
    arrow(ax, 7.25, 2.3, 7.85, 2.9, IN)
    label(ax, 8.05, 1.8, "input_queue\n(+aborts_queue)", IN)
    # outputs: busy loop -> output_queue -> PUSH -> PULL
    arrow(ax, 7.85, 3.7, 7.25, 4.4, OUT)
    label(ax, 8.75, 4.3, "output_queue", OUT)
    arrow(ax, 5.25, 4.7, 3.45, 4.7, OUT)
    label(ax, 4.3, 3.45, "EngineCoreOutputs\n(token lists) or\nENGINE_CORE_DEAD", OUT)
    arrow(ax, 9.25, 2.55, 9.25, 1.45)
    # death
    arrow(ax, 5.0, 0.95, 3.45, 0.95, DEATH, "--")
    label(ax, 4.25, 1.1, "exit / kill -9", DEATH)
    arrow(ax, 1.5, 1.45, 1.5, 2.85, DEATH, "--")
    ax.text(1.4, 2.15, "EngineDeadError\nto every caller", ha="right", va="center", fontsize=8,
            color=DEATH)
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
