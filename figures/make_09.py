"""Figures of chapter 09: the processes of `minivllm serve`, a step timeline from --trace, and
the latency distributions of a load test.

    .venv/bin/python figures/make_09.py      writes figures/09_serve.png

`draw_timeline(events, ax)` draws the events of a `minivllm serve --trace FILE` run (one row per
process and thread, one colour per span name); `draw_latency_cdfs(axes, samples)` draws the
ITL and TTFT of load-test runs as CDFs with p50 and p99 marked. Chapter 09 imports both to draw
the reader's own runs.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from drawing import box

HERE = Path(__file__).resolve().parent
REQUEST, OUTPUT = "#1f4e9c", "#b35900"


def arrow(ax, x0, y0, x1, y1, color="black", text=None, dy=0.12):
    ax.annotate("", (x1, y1), (x0, y0), arrowprops=dict(arrowstyle="->", lw=1.5, color=color))
    if text:
        ax.text((x0 + x1) / 2, (y0 + y1) / 2 + dy, text, ha="center", fontsize=8, color=color)


def draw_architecture(ax) -> None:
    box(ax, 0.1, 2.0, 1.6, 1.6, "clients\n(openai, curl)", "#eeeeee")
    box(ax, 2.4, 1.6, 2.6, 2.4, "API server\nFastAPI + uvicorn\n\nparse, chat template,\ntokenize,"
        "\ndetokenize, SSE", "#dbe9f6")
    box(ax, 6.0, 1.6, 2.6, 2.4, "engine core\n\ninput thread\nbusy loop: schedule,\nexecute, "
        "outputs\noutput thread", "#fde2c8")
    for i, y in enumerate((3.3, 2.2, 1.1)):  # every rank runs its shard; only the output rank samples
        box(ax, 9.6, y, 1.9, 0.8, f"worker TP{i}\nforward (shard)" + ("\nsample, reply" if i == 0 else ""),
            "#e2f0d9", size=8)
    arrow(ax, 1.75, 3.1, 2.35, 3.1, REQUEST, "HTTP POST")
    arrow(ax, 2.35, 2.4, 1.75, 2.4, OUTPUT, "SSE", dy=-0.3)
    arrow(ax, 5.05, 3.3, 5.95, 3.3, REQUEST, "ROUTER->DEALER")
    arrow(ax, 5.95, 2.3, 5.05, 2.3, OUTPUT, "PUSH->PULL", dy=-0.3)
    for y in (3.7, 2.6, 1.5):
        arrow(ax, 8.65, 2.8, 9.55, y, REQUEST)
    ax.text(9.1, 4.3, "shm ring\n(one broadcast)", ha="center", fontsize=8, color=REQUEST)
    arrow(ax, 9.55, 3.55, 8.65, 3.55, OUTPUT)
    ax.text(9.1, 3.62, "reply", ha="center", fontsize=8, color=OUTPUT)
    ax.text(6.0, 0.5, "-tp 1: the worker is an object inside the engine core (2 processes); "
            "-tp N: N worker processes, and only TP0 (the output rank) samples and replies",
            ha="center", fontsize=8)
    ax.set_xlim(0, 11.7)
    ax.set_ylim(0.2, 4.8)
    ax.axis("off")


def tracks(events: list[dict]) -> list[tuple[int, int, str]]:
    """(pid, tid, label) of every thread with spans, API servers first, in time order."""
    procs = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
               if e["name"] == "thread_name"}
    first: dict[tuple[int, int], float] = {}
    for e in events:
        if e["ph"] == "X":
            key = (e["pid"], e["tid"])
            first[key] = min(first.get(key, e["ts"]), e["ts"])

    def label(pid: int, tid: int) -> str:
        return f"{procs.get(pid, pid)}\n{threads.get((pid, tid), tid)}"
    order = sorted(first, key=lambda k: ("APIServer" not in str(procs.get(k[0], "")), first[k]))
    return [(pid, tid, label(pid, tid)) for pid, tid in order]


def draw_timeline(events: list[dict], ax, start_us: float | None = None,
                  end_us: float | None = None) -> None:
    """One row per (process, thread); spans as bars, coloured by name; time in ms from
    `start_us` (default: the first span), up to `end_us` (default: the last)."""
    spans = [e for e in events if e["ph"] == "X"]
    start_us = min(e["ts"] for e in spans) if start_us is None else start_us
    end_us = max(e["ts"] + e["dur"] for e in spans) if end_us is None else end_us
    spans = [e for e in spans if e["ts"] + e["dur"] >= start_us and e["ts"] <= end_us]
    rows = tracks([e for e in events if e["ph"] == "M"] + spans)
    row_of = {(pid, tid): i for i, (pid, tid, _) in enumerate(rows)}
    names = sorted({e["name"] for e in spans})
    cmap = plt.get_cmap("tab20")
    colour = {n: cmap(i % 20) for i, n in enumerate(names)}
    open_ends: dict[int, list[float]] = {}  # per row, the ends of the spans still open
    for e in sorted(spans, key=lambda e: (e["ts"], -e["dur"])):
        row = row_of[(e["pid"], e["tid"])]
        stack = open_ends.setdefault(row, [])
        while stack and stack[-1] <= e["ts"]:
            stack.pop()
        depth = min(len(stack), 3)  # a nested span is drawn thinner, inside its parent
        stack.append(e["ts"] + e["dur"])
        ax.broken_barh([((e["ts"] - start_us) / 1000, max(e["dur"] / 1000, 0.02))],
                       (row - 0.4 + 0.15 * depth, 0.8 - 0.3 * depth), color=colour[e["name"]])
    ax.set_xlim(0, (end_us - start_us) / 1000)
    ax.set_yticks(range(len(rows)), [r[2] for r in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=colour[n]) for n in names]
    ax.legend(handles, names, fontsize=7, ncol=min(len(names), 6), loc="upper center",
              bbox_to_anchor=(0.5, -0.18))


def draw_latency_cdfs(axes, samples: dict[str, dict[str, list[float]]]) -> None:
    """samples: run label -> {"itl": seconds, "ttft": seconds}. One panel per metric: the share of
    samples at or under each latency (log scale), each run's p50 (circle) and p99 (square)."""
    for ax, (metric, title) in zip(axes, [("itl", "inter-token latency"),
                                          ("ttft", "time to first token")]):
        for label, runs in samples.items():
            ms = np.sort(1e3 * np.asarray(runs[metric]))
            share = np.arange(1, len(ms) + 1) / len(ms)
            line, = ax.step(ms, share, where="post", label=label)
            for q, marker in ((50, "o"), (99, "s")):
                ax.plot(np.percentile(ms, q), q / 100, marker, color=line.get_color())
        ax.set_xscale("log")  # plain numbers: 1, 2, 5 x 10^k over a short range, else 10^k
        lo, hi = ax.get_xlim()
        subs = (1, 2, 5) if np.log10(hi / lo) <= 2.5 else (1,)
        ax.xaxis.set_major_locator(LogLocator(subs=subs, numticks=9))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set(xlabel="ms (log scale)", ylabel="share of samples at or under", title=title,
               ylim=(0, 1.02))
        ax.axhline(0.99, color="grey", lw=0.6, ls=":")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right", title="o p50, \u25a1 p99", title_fontsize=8)


def main() -> None:
    fig, ax = plt.subplots(figsize=(11, 4.6))
    draw_architecture(ax)
    ax.set_title("minivllm serve -tp 3: one request's path through the processes")
    fig.tight_layout()
    fig.savefig(HERE / "09_serve.png", dpi=110)


if __name__ == "__main__":
    import matplotlib
    matplotlib.use("Agg")
    main()
