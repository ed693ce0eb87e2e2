"""`minivllm bench nodes`: what crossing the host's edge costs, on namespace hosts of this
machine (utils/netns_cluster.py: separate network, IPC and /dev/shm; the same cores).

  - ring: one MessageQueue writer on host 0, a local reader (shm) on host 0 and a remote
    reader (tcp, XPUB/SUB) on host 1; paced small messages; one-way latency p50 and p99 of
    each; again with every host's link delayed by `tc netem` where the kernel has netem;
  - tp: decode tokens per second of a batch, TP=3 on one host (shm ring, loopback gloo)
    vs TP=3 over three hosts (one rank each: remote readers, replies and gloo over tcp).

Ratios:
    cross_host_tp3_vs_one_host_tp3_b32   cross-host tok/s / one-host tok/s, batch 32: the
                                         price of tcp over shm on the same cores (goal >= 0.8)
    remote_reader_vs_local_reader_p50    remote p50 / local p50 (reported; netem rows too)

Needs root (network namespaces); --part ring skips the model runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tqdm import tqdm

from minivllm.bench.common import bench_parser, print_table, quick_mode, write_json
from minivllm.utils import netns_cluster
from minivllm.utils.netns_cluster import NetnsCluster

PACE_S = 0.001  # one message a millisecond: no queue builds up
NETEM_MS = 1.0
BATCH = 32
PORT = 29501  # inside the cluster's own network
RUN_TIMEOUT_S = 900.0


def ring_rows(n: int, netem: bool) -> list[dict]:
    """Local and remote reader latencies of one writer, without and (if netem) with delay."""
    rows = []
    for delay in [0.0] + ([NETEM_MS] if netem else []):
        with NetnsCluster(2) as c:
            if delay:
                for i in range(2):
                    c.delay(i, delay)
            rows += [dict(row, netem_ms=delay) for row in ring_rows_on(c, n)]
    return rows


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


def tp_rows_on(c, model: str | None, tokens: int, batch: int, port: int) -> list[dict]:
    """The same on `c`'s hosts (a NetnsCluster, or bench/cross_host.py's loopback stand-in)."""
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
        run = c.popen(0, leader + [json.dumps(args), str(batch), str(tokens)],
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
    args = parser.parse_args(argv)
    why = netns_cluster.unavailable()
    if why:
        print(f"minivllm bench nodes: {why}", file=sys.stderr)
        return 2
    quick = args.quick or quick_mode()
    netem_why = netns_cluster.netem_unavailable()
    steps = (["ring"] if args.part != "tp" else []) + (["tp"] if args.part != "ring" else [])
    rows: list[dict] = []
    for step in tqdm(steps, desc="bench nodes", unit="part"):
        if step == "ring":
            rows += ring_rows(300 if quick else 3000, netem=netem_why is None)
        else:
            rows += tp_rows(args.model, 8 if quick else 64)
    ratios = ratios_of(rows)
    ring = [r for r in rows if r["part"] == "ring"]
    if ring:
        print_table(ring, ["reader", "netem_ms", "p50_us", "p99_us", "n"])
    if netem_why:
        print(f"(no netem rows: {netem_why})")
    tp = [r for r in rows if r["part"] == "tp"]
    if tp:
        print_table(tp, ["run", "batch", "tokens", "seconds", "tokens_per_s"])
    print("\n" + "\n".join(f"{k}: {v:.2f}" for k, v in ratios.items()))
    print("load average " + " ".join(f"{x:.1f}" for x in os.getloadavg())
          + f" on {os.cpu_count()} cores: above the core count, latencies are the scheduler's")
    write_json(args.json, "nodes", rows, ratios)
    return 0


def ratios_of(rows: list[dict]) -> dict[str, float]:
    ratios = {}
    ring = {(r["reader"], r["netem_ms"]): r for r in rows if r["part"] == "ring"}
    if ("local", 0.0) in ring:
        ratios["remote_reader_vs_local_reader_p50"] = (ring[("remote", 0.0)]["p50_us"]
                                                       / ring[("local", 0.0)]["p50_us"])
    if ("remote", NETEM_MS) in ring:
        ratios["remote_reader_vs_local_reader_p50_netem_1ms"] = (
            ring[("remote", NETEM_MS)]["p50_us"] / ring[("local", NETEM_MS)]["p50_us"])
    tp = {r["run"]: r for r in rows if r["part"] == "tp"}
    if tp:
        ratios["cross_host_tp3_vs_one_host_tp3_b32"] = (tp["cross_host_tp3"]["tokens_per_s"]
                                                        / tp["one_host_tp3"]["tokens_per_s"])
    return ratios
