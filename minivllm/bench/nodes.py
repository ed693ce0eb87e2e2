"""`minivllm bench nodes`: what crossing the host's edge costs, on namespace hosts of this
machine (utils/netns_cluster.py: separate network, IPC and /dev/shm; the same cores).

  - ring: one MessageQueue writer on host 0, a local reader (shm) on host 0 and a remote
    reader (tcp, XPUB/SUB) on host 1; paced small messages; one-way latency p50 and p99 of
    each; again with every host's sends delayed DELAY_MS (`tc netem` where the kernel has
    netem, the userspace wire of utils/netns_wire.py where it does not; the rows say which);
  - tp: decode tokens per second of a batch, TP=3 on one host (shm ring, loopback gloo)
    vs TP=3 over three hosts (one rank each: remote readers, replies and gloo over tcp).

Ratios:
    cross_host_tp3_vs_one_host_tp3_b32   cross-host tok/s / one-host tok/s, batch 32: the
                                         price of tcp over shm on the same cores (goal >= 0.8)
    remote_reader_vs_local_reader_p50    remote p50 / local p50 (reported; and _delay_1ms)

Needs root (network namespaces); --part ring skips the model runs; --plot FILE draws both.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from minivllm.bench.common import bench_parser, print_table, quick_mode, write_json
from minivllm.utils import netns_cluster
from minivllm.utils.netns_cluster import NetnsCluster
from minivllm.utils.progress import tqdm

PACE_S = 0.001  # one message a millisecond: no queue builds up
DELAY_MS = 1.0  # each host's sends in the delayed rows: a round trip gains 2 ms
BATCH = 32
PORT = 29501  # inside the cluster's own network
RUN_TIMEOUT_S = 900.0


def ring_rows(n: int, delay_ms: float) -> list[dict]:
    """Local and remote reader latencies of one writer, every host's sends delayed delay_ms."""
    with NetnsCluster(2, delay_ms=delay_ms) as c:
        return [dict(row, delay_ms=delay_ms, delay_by=c.delay_by or "-")
                for row in ring_rows_on(c, n)]


def ring_rows_on(c, n: int) -> list[dict]:
    """The writer and a local reader on host 0, a remote reader on host 1 of `c` (a
    NetnsCluster, or bench/cross_host.py's loopback stand-in): one row per reader."""
    mod = [sys.executable, "-m", "minivllm.bench._nodes_ring"]
    writer = c.popen(0, mod + ["writer", str(n), str(PACE_S), c.addresses[0]],
                     stdout=subprocess.PIPE, text=True)
    handle = writer.stdout.readline().strip()
    readers = [c.popen(i, mod + ["reader", str(i), handle], stdout=subprocess.PIPE, text=True)
               for i in (0, 1)]
    rows = []
    for r in readers:
        row = json.loads(r.communicate(timeout=RUN_TIMEOUT_S)[0].splitlines()[-1])
        rows.append({"part": "ring", "reader": "remote" if row["remote"] else "local", **row})
    writer.communicate(timeout=RUN_TIMEOUT_S)
    return rows


def tp_rows(model: str | None, tokens: int) -> list[dict]:
    """tok/s of TP=3 on one host, then over three hosts; both leaders run on host 0."""
    with NetnsCluster(3) as c:
        return tp_rows_on(c, model, tokens, BATCH, PORT)


def tp_rows_on(c, model: str | None, tokens: int, batch: int, port: int,
               rounds: int = 1) -> list[dict]:
    """The same on `c`'s hosts (a NetnsCluster, or bench/cross_host.py's loopback stand-in);
    each leader times `rounds` rounds (round_tokens_per_s: their spread is the noise)."""
    base = dict(model=model, tensor_parallel_size=3, num_threads=1)
    leader = [sys.executable, "-m", "minivllm.bench._nodes_leader"]
    multi = dict(base, nnodes=3, master_addr=c.addresses[0], master_port=port)
    rows = []
    for name, args in (("one_host_tp3", base), ("cross_host_tp3", multi)):
        nodes = []
        if name == "cross_host_tp3":
            serve = [sys.executable, "-m", "minivllm.cli", "serve", *([model] if model else []),
                     "--headless", "-tp", "3", "--nnodes", "3", "--master-addr",
                     c.addresses[0], "--master-port", str(port), "--num-threads", "1"]
            nodes = [c.popen(i, serve + ["--node-rank", str(i)], stdout=subprocess.DEVNULL)
                     for i in (1, 2)]
        run = c.popen(0, leader + [json.dumps(args), str(batch), str(tokens), str(rounds)],
                      stdout=subprocess.PIPE, text=True)
        out = run.communicate(timeout=RUN_TIMEOUT_S)[0]
        for node in nodes:
            node.wait(RUN_TIMEOUT_S)
        rows.append({"part": "tp", "run": name, "batch": batch,
                     **json.loads(out.splitlines()[-1])})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser("nodes", __doc__)
    parser.add_argument("--part", choices=["all", "ring", "tp"], default="all")
    parser.add_argument("--model", default=None, help="default: the bundled SmolLM2-135M")
    parser.add_argument("--plot", metavar="FILE", help="draw the latencies and tok/s into a PNG")
    args = parser.parse_args(argv)
    why = netns_cluster.unavailable()
    if why:
        print(f"minivllm bench nodes: {why}", file=sys.stderr)
        return 2
    n, tokens = (300, 8) if args.quick or quick_mode() else (3000, 64)
    phases = ([(f"ring, {d:g} ms delay", lambda d=d: ring_rows(n, d)) for d in (0.0, DELAY_MS)]
              if args.part != "tp" else [])
    if args.part != "ring":
        phases.append(("tp, one host and three", lambda: tp_rows(args.model, tokens)))
    rows: list[dict] = []
    with tqdm(phases, desc="bench nodes", unit="phase") as bar:
        for name, run in bar:
            bar.set_postfix_str(name)
            rows += run()
    ratios = ratios_of(rows)
    print_report(rows, ratios)
    write_json(args.json, "nodes", rows, ratios)
    if args.plot:
        plot(rows, args.plot)
        print(f"wrote {args.plot}")
    return 0


def print_report(rows: list[dict], ratios: dict[str, float]) -> None:
    ring = [r for r in rows if r["part"] == "ring"]
    if ring:
        print_table(ring, ["reader", "delay_ms", "delay_by", "p50_us", "p99_us", "n"])
    tp = [r for r in rows if r["part"] == "tp"]
    if tp:
        print_table(tp, ["run", "batch", "tokens", "seconds", "tokens_per_s"])
    print("\n" + "\n".join(f"{k}: {v:.2f}" for k, v in ratios.items()))
    print("load average " + " ".join(f"{x:.1f}" for x in os.getloadavg())
          + f" on {os.cpu_count()} cores: above the core count, latencies are the scheduler's")


def ratios_of(rows: list[dict]) -> dict[str, float]:
    ratios = {}
    ring = {(r["reader"], r["delay_ms"]): r for r in rows if r["part"] == "ring"}
    for delay, suffix in ((0.0, ""), (DELAY_MS, f"_delay_{DELAY_MS:g}ms")):
        if ("local", delay) in ring:
            ratios[f"remote_reader_vs_local_reader_p50{suffix}"] = (
                ring[("remote", delay)]["p50_us"] / ring[("local", delay)]["p50_us"])
    tp = {r["run"]: r for r in rows if r["part"] == "tp"}
    if tp:
        ratios["cross_host_tp3_vs_one_host_tp3_b32"] = (tp["cross_host_tp3"]["tokens_per_s"]
                                                        / tp["one_host_tp3"]["tokens_per_s"])
    return ratios


def plot(rows: list[dict], path: str, title: str = "this machine") -> None:
    """The ring readers' p50 and p99 by delay (left) and TP=3's tok/s (right), as one PNG."""
    import matplotlib
    if matplotlib.get_backend().lower().startswith("qt"):
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ring = [r for r in rows if r["part"] == "ring"]
    tp = [r for r in rows if r["part"] == "tp"]
    fig, axes = plt.subplots(1, int(bool(ring)) + int(bool(tp)), figsize=(10, 4), squeeze=False)
    axes = list(axes[0])
    if ring:
        ax = axes.pop(0)
        labels = [f"{r['reader']}\n{r['delay_ms']:g} ms ({r['delay_by']})" if r["delay_ms"]
                  else f"{r['reader']}\nno delay" for r in ring]
        xs = range(len(ring))
        ax.bar([x - 0.2 for x in xs], [r["p50_us"] for r in ring], 0.4, label="p50")
        ax.bar([x + 0.2 for x in xs], [r["p99_us"] for r in ring], 0.4, label="p99")
        ax.set_xticks(list(xs), labels, fontsize=8)
        ax.set(yscale="log", ylabel="one-way latency (µs)",
               title=f"a ring message, local vs remote reader ({title})")
        ax.legend(fontsize=8)
    if tp:
        ax = axes.pop(0)
        ax.bar([r["run"] for r in tp], [r["tokens_per_s"] for r in tp], color="tab:green")
        ax.set(ylabel="decode tok/s", title=f"TP=3, batch {tp[0]['batch']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
