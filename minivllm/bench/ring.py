"""`minivllm bench ring`: MessageQueue (shared-memory ring) vs ZMQ PUB/SUB over ipc, with a
bare byte ring as the limit.

One writer broadcasts to N reader processes (2 by default), all three transports in one run:
  - 1 KiB messages as fast as possible: messages/s and the CPU seconds of all processes;
  - 1 KiB messages paced (one every PACE_S): one-way latency p50 and p99;
  - a size sweep, into sizes that overflow the ring's chunks onto its ZMQ socket.
Each headline figure is the median of --repeats runs; the ratios compare medians of one run.
Fair by construction: MessageQueue and PUB/SUB carry the same object ([send time, payload
bytes]) through the same MsgpackEncoder/MsgpackDecoder; the bare ring ("raw", _ring_workers.py)
carries the same bytes in the same ShmRingBuffer with no serialization and readers that only
spin: what MessageQueue could reach at best. Every transport is called the same way, send(obj,
timeout) and recv(timeout), with no wrapper around either. Same message counts, one unreported
warm-up run each, alternating run by run; CPU seconds are every process's (threads included)
from the first send until the last reader is done.

Ratios:
    mq_vs_raw_ring_msgs_per_s   MessageQueue msgs/s / bare ring msgs/s    (goal >= 0.9)
    mq_vs_pubsub_msgs_per_s     MessageQueue msgs/s / PUB/SUB msgs/s
    mq_vs_pubsub_p50_latency    PUB/SUB p50 / MessageQueue p50, paced    (goal >= 4)
"""

from __future__ import annotations

import multiprocessing as mp
import os
import statistics

from minivllm.bench.common import bench_parser, print_table, quick_mode, write_json
from minivllm.bench._ring_workers import RAW_HEADER, Phase, reader_main, run_phase
from minivllm.utils.progress import tqdm

MESSAGE_BYTES = 1024
# Chunks of 64 KiB: a 1 KiB message fits, the last sizes of the sweep overflow. 256 of them
# (16 MiB) let the writer run ahead while the readers wait for a core.
MAX_CHUNK_BYTES = 64 * 1024
MAX_CHUNKS = 256
PACE_S = 0.0005  # one message per 0.5 ms: slow enough that no queue builds up
SWEEP_SIZES = [64, 1024, 16 * 1024, 60 * 1024, 256 * 1024, 1024 * 1024]
SWEEP_BYTES = 256 << 20  # each sweep point moves about this much, capped by the message count
TRANSPORTS = ("mq", "raw", "pubsub")


class ReaderPool:
    """n_reader spawned processes that run whatever phases the writer sends them."""

    def __init__(self, n_reader: int):
        ctx = mp.get_context("spawn")  # a notebook or a threaded parent can start it safely
        pipes = [ctx.Pipe() for _ in range(n_reader)]
        self.conns = [a for a, _ in pipes]
        self.procs = [ctx.Process(target=reader_main, args=(r, b), daemon=True)
                      for r, (_, b) in enumerate(pipes)]
        for p in self.procs:
            p.start()

    def run(self, phase: Phase) -> dict:
        return run_phase(phase, self.conns, MAX_CHUNK_BYTES, MAX_CHUNKS)

    def close(self) -> None:
        for conn in self.conns:
            try:
                conn.send(None)
            except OSError:
                pass
        for p in self.procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join()

    def __enter__(self) -> "ReaderPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def plan(quick: bool, repeats: int) -> tuple[list[Phase], list[Phase], list[Phase]]:
    """(warm-up, headline, sweep). The warm-up runs each transport once, unreported: imports,
    first page faults and socket buffers are paid before either one is measured."""
    n_fast, n_paced = (5_000, 300) if quick else (100_000, 2_000)
    warmup = [Phase(t, MESSAGE_BYTES, n_fast // 5) for t in TRANSPORTS]
    headline = []
    for _ in range(repeats):
        for transport in TRANSPORTS:
            headline.append(Phase(transport, MESSAGE_BYTES, n_fast))
            headline.append(Phase(transport, MESSAGE_BYTES, n_paced, pace_s=PACE_S))
    sweep_cap = 2_000 if quick else 50_000
    sweep_bytes = SWEEP_BYTES // (16 if quick else 1)
    sweep = [Phase(t, s, max(50, min(sweep_cap, sweep_bytes // s)))
             for s in SWEEP_SIZES for t in TRANSPORTS
             if t != "raw" or s + RAW_HEADER.size <= MAX_CHUNK_BYTES]  # the bare ring cannot overflow
    return warmup, headline, sweep


def median_row(rows: list[dict], transport: str, paced: bool) -> dict:
    mine = [r for r in rows if r["transport"] == transport and r["paced"] == paced]
    out = {"transport": transport, "size": mine[0]["size"], "paced": paced, "runs": len(mine),
           "part": "headline"}
    for key in ("msgs_per_s", "p50_us", "p99_us", "cpu_s", "wall_s"):
        out[key] = statistics.median(r[key] for r in mine)
    return out


def load_average() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser("ring", __doc__)
    parser.add_argument("--readers", type=int, default=2, help="reader processes (default 2)")
    parser.add_argument("--repeats", type=int, default=None, help="runs per headline figure")
    args = parser.parse_args(argv)
    quick = args.quick or quick_mode()
    repeats = args.repeats or (1 if quick else 5)
    warmup, headline, sweep = plan(quick, repeats)
    raw: list[dict] = []
    with ReaderPool(args.readers) as pool:
        for phase in warmup:
            pool.run(phase)
        for phase in tqdm(headline + sweep, desc="bench ring", unit="phase"):
            row = pool.run(phase)
            row.update(paced=phase.pace_s > 0, part="headline" if phase in headline else "sweep")
            raw.append(row)
    head = [r for r in raw if r["part"] == "headline"]
    table = [median_row(head, t, paced) for paced in (False, True) for t in TRANSPORTS]
    print(f"\n{args.readers} readers, {MESSAGE_BYTES} B messages, median of {repeats} run(s) "
          f"(paced: one message per {PACE_S * 1e3:g} ms); load average {load_average()}")
    print_table(table, ["transport", "paced", "msgs_per_s", "p50_us", "p99_us", "cpu_s", "runs"])
    sweep_rows = [r for r in raw if r["part"] == "sweep"]
    print(f"\nsize sweep (chunks of {MAX_CHUNK_BYTES // 1024} KiB: bigger messages overflow to ZMQ)")
    print_table(sweep_rows, ["transport", "size", "n", "msgs_per_s", "MB_per_s", "p50_us", "cpu_s"])
    fast = {r["transport"]: r for r in table if not r["paced"]}
    paced = {r["transport"]: r for r in table if r["paced"]}
    ratios = {
        "mq_vs_raw_ring_msgs_per_s": fast["mq"]["msgs_per_s"] / fast["raw"]["msgs_per_s"],
        "mq_vs_pubsub_msgs_per_s": fast["mq"]["msgs_per_s"] / fast["pubsub"]["msgs_per_s"],
        "mq_vs_pubsub_p50_latency": paced["pubsub"]["p50_us"] / paced["mq"]["p50_us"],
    }
    print("\n" + "\n".join(f"{k}: {v:.2f}" for k, v in ratios.items()))
    write_json(args.json, "ring", table + sweep_rows, ratios)
    return 0
