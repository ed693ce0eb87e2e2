"""Figure of the glossary: one engine step through the processes of `minivllm serve -tp 2`, from
the HTTP request to the streamed text, labelled with the names in the code.

    .venv/bin/python figures/make_00.py      writes figures/00_engine_step.png
"""

from __future__ import annotations

from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt

from drawing import box, save_diagram

HERE = Path(__file__).resolve().parent
IN, OUT, RING = "#1f4e9c", "#b35900", "#2e7d32"
# Each process's lane: x, width, title, edge colour, fill. Between lanes: what crosses them.
LANES = {
    "client": (0.1, 1.9, "client", "#555555", "#f4f4f4"),
    "api": (3.3, 3.5, "API server process", IN, "#f3f7fc"),
    "core": (8.1, 3.6, "engine core process", OUT, "#fef6ee"),
    "workers": (13.9, 3.0, "worker processes (TP = 2)", RING, "#f1f8ee"),
}
TOP = 8.6  # the lanes' top edge


def arrow(ax, x0, y0, x1, y1, color="black", both=False):
    ax.annotate("", (x1, y1), (x0, y0),
                arrowprops=dict(arrowstyle="<->" if both else "->", lw=1.5, color=color))


def note(ax, x, y, text, color="black", ha="center"):
    ax.text(x, y, text, ha=ha, va="center", fontsize=8, color=color)


def lanes(ax) -> None:
    for x, w, title, edge, fill in LANES.values():
        ax.add_patch(plt.Rectangle((x, 0.2), w, TOP - 0.2, fc=fill, ec=edge, lw=1.2))
        ax.text(x + w / 2, TOP - 0.3, title, ha="center", va="center", fontsize=9,
                weight="bold")


def boxes(ax) -> None:
    box(ax, 0.2, 6.6, 1.7, 1.0, "openai client\nor curl", "#e8e8e8")
    box(ax, 0.2, 0.8, 1.7, 1.0, "prints the\nnew text", "#e8e8e8")
    box(ax, 3.45, 6.4, 3.2, 1.3, "OpenAIServingChat\nAsyncLLM.generate:\n"
        "tokenize -> EngineCoreRequest", "#dbe9f6")
    box(ax, 3.45, 0.6, 3.2, 1.6, "(7) output handler:\nOutputProcessor.process_outputs\n"
        "detokenize -> RequestOutput\n-> sse(): data: {...}", "#dbe9f6")
    box(ax, 8.25, 6.6, 3.3, 1.0, "input thread (DEALER)\n-> input_queue", "#fde2c8")
    box(ax, 8.25, 4.6, 3.3, 1.3, "busy loop: EngineCore.step()\nScheduler.schedule()\n"
        "-> SchedulerOutput", "#fff3c4")
    box(ax, 8.25, 2.6, 3.3, 1.1, "Scheduler.update_from_output\n-> EngineCoreOutputs",
        "#fff3c4")
    box(ax, 8.25, 0.7, 3.3, 1.1, "output thread (PUSH)\n<- output_queue", "#fde2c8")
    box(ax, 12.1, 4.7, 1.4, 1.1, "MessageQueue\n(shared-\nmemory ring)", "#cfe8c6", size=8)
    box(ax, 14.05, 6.3, 2.7, 1.3, "WorkerProc rank 1\nforward on its shard\n(no reply)",
        "#e2f0d9")
    box(ax, 14.05, 3.0, 2.7, 1.8, "WorkerProc rank 0\n(output rank)\nforward,\n"
        "compute_logits, sample", "#e2f0d9")


def flows(ax) -> None:
    arrow(ax, 1.95, 7.1, 3.4, 7.1, IN)
    note(ax, 2.65, 6.1, "(1) POST\n/v1/chat/\ncompletions", IN)
    arrow(ax, 6.7, 7.1, 8.2, 7.1, IN)
    note(ax, 7.45, 6.0, "EngineCore-\nRequest,\nmsgpack\nover ZMQ", IN)
    arrow(ax, 9.9, 6.55, 9.9, 5.95, IN)
    note(ax, 10.1, 6.25, "(2) schedule", IN, ha="left")
    arrow(ax, 11.6, 5.25, 12.05, 5.25, RING)
    note(ax, 12.8, 6.55, "(3) one\nExecuteModel,\nread by all", RING)
    arrow(ax, 13.55, 5.6, 14.0, 6.9, RING)
    arrow(ax, 13.55, 4.9, 14.0, 4.5, RING)
    arrow(ax, 14.6, 4.85, 14.6, 6.25, RING, both=True)
    note(ax, 14.8, 5.55, "(4) all-reduce\nin every layer", RING, ha="left")
    arrow(ax, 14.0, 3.4, 11.6, 3.15, RING)
    note(ax, 12.8, 2.4, "(5) ModelRunner-\nOutput: sampled\ntoken ids, by a\nreply "
         "MessageQueue", RING)
    arrow(ax, 9.9, 2.55, 9.9, 1.85, OUT)
    note(ax, 10.1, 2.2, "(6) send", OUT, ha="left")
    arrow(ax, 8.2, 1.25, 6.7, 1.25, OUT)
    note(ax, 7.45, 2.45, "EngineCore-\nOutputs,\nmsgpack\nover ZMQ", OUT)
    arrow(ax, 3.4, 1.3, 1.95, 1.3, OUT)
    note(ax, 2.65, 2.4, "(8) an SSE\nevent with\nthe new text", OUT)


def main() -> None:
    fig, ax = plt.subplots(figsize=(12.5, 6.6))
    lanes(ax)
    boxes(ax)
    flows(ax)
    save_diagram(fig, ax, (0, 17.0), (0, 8.7), HERE / "00_engine_step.png",
                 "One engine step through the processes of minivllm serve -tp 2 "
                 "(vLLM V1's layout)")


if __name__ == "__main__":
    matplotlib.use("Agg")  # only when run as a script: an importer keeps its backend
    main()
