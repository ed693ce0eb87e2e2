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
    "client": (0.1, 2.1, "client", "#555555", "#f4f4f4"),
    "api": (3.1, 3.9, "API server process", IN, "#f3f7fc"),
    "core": (7.9, 3.8, "engine core process", OUT, "#fef6ee"),
    "workers": (13.6, 3.1, "worker processes (TP = 2)", RING, "#f1f8ee"),
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
    box(ax, 0.25, 6.6, 1.8, 1.0, "openai client\nor curl", "#e8e8e8")
    box(ax, 0.25, 0.8, 1.8, 1.0, "prints the\nnew text", "#e8e8e8")
    box(ax, 3.3, 6.4, 3.5, 1.3, "OpenAIServingChat\nAsyncLLM.generate:\n"
        "tokenize -> EngineCoreRequest", "#dbe9f6")
    box(ax, 3.3, 0.6, 3.5, 1.6, "(7) output handler:\nOutputProcessor.process_outputs\n"
        "detokenize -> RequestOutput\n-> sse(): data: {...}", "#dbe9f6")
    box(ax, 8.05, 6.6, 3.5, 1.0, "input thread (DEALER)\n-> input_queue", "#fde2c8")
    box(ax, 8.05, 4.6, 3.5, 1.3, "busy loop: EngineCore.step()\nScheduler.schedule()\n"
        "-> SchedulerOutput", "#fff3c4")
    box(ax, 8.05, 2.6, 3.5, 1.1, "Scheduler.update_from_output\n-> EngineCoreOutputs",
        "#fff3c4")
    box(ax, 8.05, 0.7, 3.5, 1.1, "output thread (PUSH)\n<- output_queue", "#fde2c8")
    box(ax, 11.95, 4.7, 1.4, 1.1, "MessageQueue\n(shared-\nmemory ring)", "#cfe8c6", size=8)
    box(ax, 13.75, 6.3, 2.8, 1.3, "WorkerProc rank 1\nforward on its shard\n(no reply)",
        "#e2f0d9")
    box(ax, 13.75, 3.0, 2.8, 1.8, "WorkerProc rank 0\n(output rank)\nforward,\n"
        "compute_logits, sample", "#e2f0d9")


def flows(ax) -> None:
    arrow(ax, 2.1, 7.1, 3.25, 7.1, IN)
    note(ax, 2.65, 6.1, "(1) POST\n/v1/chat/\ncompletions", IN)
    arrow(ax, 6.85, 7.1, 8.0, 7.1, IN)
    note(ax, 7.45, 6.0, "EngineCore-\nRequest,\nmsgpack\nover ZMQ", IN)
    arrow(ax, 9.8, 6.55, 9.8, 5.95, IN)
    note(ax, 10.0, 6.25, "(2) schedule", IN, ha="left")
    arrow(ax, 11.6, 5.25, 11.9, 5.25, RING)
    note(ax, 12.65, 6.55, "(3) one\nExecuteModel,\nread by all", RING)
    arrow(ax, 13.4, 5.6, 13.7, 6.9, RING)
    arrow(ax, 13.4, 4.9, 13.7, 4.5, RING)
    arrow(ax, 14.3, 4.85, 14.3, 6.25, RING, both=True)
    note(ax, 14.5, 5.55, "(4) all-reduce\nin every layer", RING, ha="left")
    arrow(ax, 13.7, 3.4, 11.6, 3.15, RING)
    note(ax, 12.6, 2.4, "(5) ModelRunnerOutput:\nsampled token ids,\nby a reply MessageQueue",
         RING)
    arrow(ax, 9.8, 2.55, 9.8, 1.85, OUT)
    note(ax, 10.0, 2.2, "(6) send", OUT, ha="left")
    arrow(ax, 8.0, 1.25, 6.85, 1.25, OUT)
    note(ax, 7.45, 2.45, "EngineCore-\nOutputs,\nmsgpack\nover ZMQ", OUT)
    arrow(ax, 3.25, 1.3, 2.1, 1.3, OUT)
    note(ax, 2.65, 2.4, "(8) an SSE\nevent with\nthe new text", OUT)


def main() -> None:
    fig, ax = plt.subplots(figsize=(15, 7.4))
    lanes(ax)
    boxes(ax)
    flows(ax)
    save_diagram(fig, ax, (0, 16.8), (0, 8.7), HERE / "00_engine_step.png",
                 "One engine step through the processes of minivllm serve -tp 2 "
                 "(vLLM V1's layout)")


if __name__ == "__main__":
    matplotlib.use("Agg")  # only when run as a script: an importer keeps its backend
    main()
