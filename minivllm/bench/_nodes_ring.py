"""The processes of `minivllm bench nodes`' ring part, each started on a namespace host:

    python -m minivllm.bench._nodes_ring writer N PACE_S CONNECT_IP   # prints the Handle
    python -m minivllm.bench._nodes_ring reader RANK HANDLE_JSON      # prints its latencies

The writer broadcasts N small messages, one every PACE_S, each carrying its time.perf_counter()
(CLOCK_MONOTONIC: one clock for every namespace of the machine, so one-way latency is a plain
difference); a reader prints {"rank", "remote", "p50_us", "p99_us"} as one JSON line.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time

from minivllm.bench.common import percentile
from minivllm.distributed.shm_broadcast import Handle, MessageQueue

READY_TIMEOUT_S = 60.0
PAYLOAD = b"x" * 256  # a small step: what a decode step's broadcast weighs, about


def writer(n: int, pace_s: float, connect_ip: str) -> None:
    with MessageQueue(2, 1, connect_ip=connect_ip) as mq:
        print(json.dumps(dataclasses.asdict(mq.export_handle())), flush=True)
        mq.wait_until_ready(READY_TIMEOUT_S)
        for _ in range(n):
            mq.enqueue([time.perf_counter(), PAYLOAD])
            time.sleep(pace_s)
        mq.enqueue(None)


def handle_from_json(handle_json: str) -> Handle:
    """The Handle a writer printed with json.dumps(dataclasses.asdict(handle))."""
    fields = json.loads(handle_json)
    if fields["buffer_handle"] is not None:
        fields["buffer_handle"] = tuple(fields["buffer_handle"])
    return Handle(**fields)


def reader(rank: int, handle_json: str) -> None:
    handle = handle_from_json(handle_json)
    latencies = []
    with MessageQueue.create_from_handle(handle, rank) as mq:
        mq.wait_until_ready(READY_TIMEOUT_S)
        while (msg := mq.dequeue(READY_TIMEOUT_S)) is not None:
            latencies.append(time.perf_counter() - msg[0])
    warm = latencies[len(latencies) // 10:]  # the first tenth: connections and caches warm up
    print(json.dumps({"rank": rank, "remote": rank not in handle.local_reader_ranks,
                      "p50_us": percentile(warm, 50) * 1e6, "p99_us": percentile(warm, 99) * 1e6,
                      "n": len(warm)}), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "writer":
        writer(int(sys.argv[2]), float(sys.argv[3]), sys.argv[4])
    else:
        reader(int(sys.argv[2]), sys.argv[3])
