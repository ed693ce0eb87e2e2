"""Figures of chapter 05: the ring's memory layout, the chunk format of a message, and the
schedule that breaks flag order.

    .venv/bin/python figures/make_05.py      writes figures/05_ring_layout.png,
                                             figures/05_chunk_format.png and
                                             figures/05_flag_order_schedule.png

The schedule is not drawn by hand: it is what the judge's interleaving explorer finds when it
runs the chapter's own ring (minivllm's ShmRingBuffer, its flag steps on the explorer's
instrumented buffer) with the written flag set before the read flags are cleared.
The chapter imports explore_ring() and draw_schedule() to redraw it on the reader's run.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Callable

import matplotlib
import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

from minivllm.distributed.shm_ring import ShmRingBuffer
from minivllm.judge.interleave import InstrumentedBuffer, Violation, explore

HERE = Path(__file__).resolve().parent
MESSAGES = [b"m0", b"m1-", b"m2--"]  # different lengths: a length read at the wrong moment shows
# The smallest scenario that breaks a wrong order: 1 reader, 2 chunks, 3 messages (the writer
# laps the ring and refills chunk 0 while the reader may still be on it), 2 preemptions.
SCENARIO = dict(n_reader=1, n_chunks=2, chunk_bytes=8, bound=2)


def ring_on(view, n_reader: int, n_chunks: int, chunk_bytes: int) -> ShmRingBuffer:
    """minivllm's ShmRingBuffer with `view` (the explorer's buffer) in place of a segment: its
    own flag steps (writable, end_write, readable, end_read) run on bytes the explorer watches."""
    ring = object.__new__(ShmRingBuffer)
    ring.n_reader, ring.max_chunk_bytes, ring.max_chunks = n_reader, chunk_bytes, n_chunks
    ring.metadata_size, ring.metadata_offset = 1 + n_reader, n_chunks * chunk_bytes
    ring._written = [ring.metadata_offset + i * ring.metadata_size for i in range(n_chunks)]
    ring._none_read, ring._all_read = bytes(n_reader), b"\x01" * n_reader
    ring.buf = view
    return ring


def _label(n_reader: int, n_chunks: int, chunk_bytes: int) -> Callable[[int, int], str]:
    """Names the bytes of one access for the timeline: 'chunk 0 written flag', 'chunk 1 payload'."""
    base = n_chunks * chunk_bytes

    def label(start: int, stop: int) -> str:
        if start < base:
            chunk, i = divmod(start, chunk_bytes)
            return f"chunk {chunk} " + ("length and payload" if i == 0 and stop - start > 1
                                        else "length" if i == 0 else "payload")
        chunk, k = divmod(start - base, 1 + n_reader)
        flags = "written flag" if k == 0 else f"read flag of reader {k - 1}"
        if stop - start > 1:
            flags = "written flag and read flags" if k == 0 else "read flags"
        return f"chunk {chunk} {flags}"
    return label


def explore_ring(publish: Callable[[ShmRingBuffer, int], None] = ShmRingBuffer.end_write,
                 copy_before_release: bool = True):
    """Run the writer and the readers of chapter 05's ring as threads under the explorer.

    The writer fills a chunk as section 4.1 does (written = 0, one length byte, the payload)
    and publishes it with `publish(ring, idx)`; each reader copies the payload out and then
    releases the chunk (end_read), or the other way round. Returns the explorer's SearchResult.
    """
    n_reader, n_chunks, chunk_bytes = (SCENARIO[k] for k in ("n_reader", "n_chunks", "chunk_bytes"))
    size = n_chunks * (chunk_bytes + 1 + n_reader)
    got: list[list[bytes]] = []

    def make_bodies():
        shared = InstrumentedBuffer(size, _label(n_reader, n_chunks, chunk_bytes))
        got[:] = [[] for _ in range(n_reader)]

        def writer(ctx):
            ring = ring_on(shared.bind(ctx), n_reader, n_chunks, chunk_bytes)
            for i, payload in enumerate(MESSAGES):
                idx, mark = i % n_chunks, ctx.checkpoint()
                while not ring.writable(idx):  # a poll that stores nothing: sleep until a store
                    ctx.block(since=mark)
                    mark = ctx.checkpoint()
                start = idx * chunk_bytes
                ring.buf[ring.written_offset(idx)] = 0
                ring.buf[start:start + 1 + len(payload)] = bytes([len(payload)]) + payload
                publish(ring, idx)
                ctx.note(f"wrote {payload!r}")

        def reader(r):
            def body(ctx):
                ring = ring_on(shared.bind(ctx), n_reader, n_chunks, chunk_bytes)
                for i, want in enumerate(MESSAGES):
                    idx, mark = i % n_chunks, ctx.checkpoint()
                    while not ring.readable(idx, r):
                        ctx.block(since=mark)
                        mark = ctx.checkpoint()
                    start = idx * chunk_bytes
                    if not copy_before_release:
                        ring.end_read(idx, r)
                    payload = ring.buf[start + 1:start + 1 + ring.buf[start]]
                    if copy_before_release:
                        ring.end_read(idx, r)
                    ctx.note(f"received {payload!r}")
                    got[r].append(payload)
                    if payload != want:
                        seen = "a message it already had" if payload in MESSAGES[:i] else "a corrupted message"
                        raise Violation(f"received {payload!r} as message {i}, "  # the explorer
                                        f"expected {want!r} ({seen})")  # names the thread
            return body
        return [writer] + [reader(r) for r in range(n_reader)]

    def final_check():
        for r, seq in enumerate(got):
            if seq != MESSAGES:
                raise Violation(f"reader {r} received {seq}, expected {MESSAGES}")

    names = ["writer"] + [f"reader {r}" for r in range(n_reader)]
    return explore(names, make_bodies, final_check, preemption_bound=SCENARIO["bound"],
                   max_runs=30_000)


def publish_written_first(ring: ShmRingBuffer, idx: int) -> None:
    """The wrong order, for the figure: written = 1, then the read flags cleared."""
    w = ring.written_offset(idx)
    ring.buf[w] = 1
    for k in range(ring.n_reader):
        ring.buf[w + 1 + k] = 0


def breaking_schedule():
    return explore_ring(publish_written_first)


def _style(thread: str, text: str) -> tuple[str, str]:
    if text.startswith("store") and "flag" in text:
        return ("tab:blue" if thread == "writer" else "tab:orange"), "bold"
    if text.startswith(("store", "load")):
        return "dimgray", "normal"
    return "tab:green", "bold"  # a note: wrote / received


def erased_reads(events) -> list[int]:
    """Steps where the writer clears a read flag that a reader had set after the new data was
    published: the read is forgotten, and the reader will take the message again."""
    last_store: dict[int, tuple[str, int]] = {}
    found = []
    for i, e in enumerate(events):
        m = re.match(r"store buf\[(\d+)(?::(\d+))?\] = (.*?)(?:   \(|$)", e.text)
        if not m:
            continue
        start = int(m.group(1))
        value = m.group(3)
        values = list(ast.literal_eval(value)) if value.startswith("b") else [int(value)]
        offsets = range(start, start + len(values))
        if e.thread == "writer" and any(
                v == 0 and last_store.get(o, ("writer", 0))[0] != "writer" and last_store[o][1] == 1
                for o, v in zip(offsets, values)):
            found.append(i)
        for o, v in zip(offsets, values):
            last_store[o] = (e.thread, v)
    return found


def draw_schedule(result, path: Path | None = None):
    """A sequence diagram of the failing run: one column per thread, one row per step."""
    events = result.failure.events
    threads = result.thread_names
    fig, ax = plt.subplots(figsize=(11, 0.28 * len(events) + 1.4))
    for i in erased_reads(events):
        ax.add_patch(Rectangle((0.005, -i - 0.45), 0.48, 0.9, facecolor="#fde0dc", edgecolor="none"))
        ax.text(0.51, -i, "<- erases the reader's read of the message just published", fontsize=7,
                color="tab:red", va="center")
    for i, e in enumerate(events):
        col = threads.index(e.thread)
        color, weight = _style(e.thread, e.text)
        if i == len(events) - 1:
            color = "tab:red"
        text = e.text.replace("   (", "  (")
        ax.text(0.02 + 0.5 * col, -i, f"{i + 1:2d}. {text}", color=color, weight=weight,
                fontsize=7.5, family="monospace", va="center")
    for col, name in enumerate(threads):
        ax.text(0.02 + 0.5 * col, 1.3, name, fontsize=11, weight="bold")
    ax.axvline(0.49, color="lightgray")
    ax.set_xlim(0, 1)
    ax.set_ylim(-len(events), 2)
    ax.axis("off")
    ax.set_title("Flag order broken (written flag set before the read flags are cleared):\n"
                 + result.failure.failure, fontsize=9, loc="left")
    fig.tight_layout()
    if path:
        fig.savefig(path, dpi=110)
    return fig


def draw_layout(path: Path | None = None, n_reader: int = 2, n_chunks: int = 4):
    """Data chunks first, then (1 + n_reader) flag bytes per chunk: vLLM's layout; then the
    waiting byte that only minivllm has (chapter 05, section 4.4)."""
    fig, ax = plt.subplots(figsize=(11, 2.4))
    x = 0.0
    for i in range(n_chunks):
        ax.add_patch(Rectangle((x, 0), 1.6, 1, facecolor="#cfe2f3", edgecolor="black"))
        ax.text(x + 0.8, 0.5, f"chunk {i}\nmax_chunk_bytes", ha="center", va="center", fontsize=8)
        x += 1.6
    for i in range(n_chunks):
        for k in range(1 + n_reader):
            face = "#f4cccc" if k == 0 else "#fff2cc"
            ax.add_patch(Rectangle((x, 0), 0.32, 1, facecolor=face, edgecolor="black"))
            ax.text(x + 0.16, 0.5, "w" if k == 0 else f"r{k - 1}", ha="center", va="center",
                    fontsize=8)
            x += 0.32
        ax.text(x - 0.16 * (1 + n_reader) * 2 / 2, -0.25, f"meta {i}", ha="center", fontsize=8)
    meta_end = x
    ax.add_patch(Rectangle((x, 0), 0.32, 1, facecolor="#d9ead3", edgecolor="black"))
    ax.text(x + 0.16, 0.5, "wt", ha="center", va="center", fontsize=8)
    ax.text(x + 0.16, -0.25, "waiting\n(minivllm)", ha="center", va="top", fontsize=8)
    x += 0.32
    ax.annotate("", xy=(0, 1.25), xytext=(1.6 * n_chunks, 1.25),
                arrowprops=dict(arrowstyle="<->"))
    ax.text(0.8 * n_chunks, 1.4, "data: max_chunks x max_chunk_bytes", ha="center", fontsize=9)
    ax.annotate("", xy=(1.6 * n_chunks, 1.25), xytext=(meta_end, 1.25),
                arrowprops=dict(arrowstyle="<->"))
    ax.text((1.6 * n_chunks + meta_end) / 2, 1.4, "metadata: max_chunks x (1 + n_reader) bytes",
            ha="center", fontsize=9)
    ax.set_xlim(-0.1, x + 0.1)
    ax.set_ylim(-0.7, 1.7)
    ax.axis("off")
    ax.set_title(f"ShmRingBuffer, {n_chunks} chunks, {n_reader} readers: w = written flag, "
                 "rK = read flag of reader K, wt = a reader is about to block (one byte each)",
                 fontsize=9)
    fig.tight_layout()
    if path:
        fig.savefig(path, dpi=110)
    return fig


def draw_chunk_format(path: Path | None = None):
    """One message in one chunk (MessageQueue's format, exercise 214's spec), and an overflow."""
    fig, ax = plt.subplots(figsize=(11, 2.9))
    rows = [  # (label, [(width, text, colour)])
        ("a message of 2 frames\n(fits the chunk)",
         [(0.9, "0", "#d9ead3"), (1.3, "n = 2\nu16 LE", "#fff2cc"), (1.5, "len 0\nu32 LE", "#fce5cd"),
          (1.5, "len 1\nu32 LE", "#fce5cd"), (2.2, "frame 0\n(msgpack body)", "#cfe2f3"),
          (1.8, "frame 1\n(array bytes)", "#cfe2f3"), (1.2, "unused", "#eeeeee")]),
        ("a message too big\n(overflow)",
         [(0.9, "1", "#f4cccc"), (9.5, "not read: the frames go out on the ZMQ XPUB socket", "#eeeeee")]),
    ]
    for row, (label, cells) in enumerate(rows):
        y, x = 1.6 - 1.5 * row, 2.6
        ax.text(0.0, y + 0.45, label, va="center", fontsize=9, weight="bold")
        for width, text, colour in cells:
            ax.add_patch(Rectangle((x, y), width, 0.9, facecolor=colour, edgecolor="black"))
            ax.text(x + width / 2, y + 0.45, text, ha="center", va="center", fontsize=8)
            x += width
    ax.text(3.05, 2.75, "byte 0:\noverflow", ha="center", fontsize=8)
    ax.text(3.9 + 2.0, 2.75, "bytes 1-2, then 4 bytes per frame", ha="center", fontsize=8)
    ax.text(7.6 + 2.0, 2.75, "the frames, back to back, no padding", ha="center", fontsize=8)
    ax.set_xlim(-0.1, 13.2)
    ax.set_ylim(-0.1, 3.3)
    ax.axis("off")
    ax.set_title("One chunk of the ring: a header of 3 + 4n bytes, then the n frames; "
                 "or only byte 0 = 1 (overflow)", fontsize=9)
    fig.tight_layout()
    if path:
        fig.savefig(path, dpi=110)
    return fig


if __name__ == "__main__":
    matplotlib.use("Agg")  # only when run as a script: an importer (a chapter) keeps its backend
    draw_layout(HERE / "05_ring_layout.png")
    draw_chunk_format(HERE / "05_chunk_format.png")
    draw_schedule(breaking_schedule(), HERE / "05_flag_order_schedule.png")
    print("wrote", HERE / "05_ring_layout.png", HERE / "05_chunk_format.png", "and",
          HERE / "05_flag_order_schedule.png")
