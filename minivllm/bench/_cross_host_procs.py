"""The processes of chapter 10's experiments (minivllm/bench/cross_host.py), each started on
a host of a NetnsCluster, or on this machine when the "hosts" are loopback stand-ins:

    python -m minivllm.bench._cross_host_procs all_reduce RANK WORLD INIT_METHOD LOCAL_IP SIZES REPS
    python -m minivllm.bench._cross_host_procs reply_writer CONNECT_IP     # prints its Handle
    python -m minivllm.bench._cross_host_procs watcher HANDLE_JSON         # prints when lost

all_reduce: joins a gloo group of WORLD ranks and times all-reduces of each size in SIZES (a
JSON list of float32 counts); rank 0 prints {numel: median seconds} as one JSON line.
reply_writer: what a remote worker's reply queue is, a MessageQueue with one remote reader;
it waits for its reader and then idles until it is killed (or its link is cut).
watcher: the leader's side, a tcp reader of that queue with a PeerWatch on its socket (as
MultiprocExecutor._watch_remote_workers); prints "watching", then {"lost_at": time.time()}
when the connection is reported gone (time.time(): one clock for every namespace).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import threading
import time

from minivllm.distributed.shm_broadcast import MessageQueue

READY_TIMEOUT_S = 60.0
WATCH_TIMEOUT_S = 60.0  # a watcher that hears nothing gives up (the experiment failed)


def all_reduce(rank: int, world: int, init_method: str, local_ip: str, sizes: list[int],
               reps: int) -> None:
    import numpy as np
    import torch

    from minivllm.distributed import parallel_state
    tp = parallel_state.init_distributed_environment(rank, world, init_method, "gloo",
                                                     local_ip=local_ip)
    medians = {}
    for numel in sizes:
        x, times = torch.ones(numel), []
        tp.all_reduce(x)  # warm-up: connections and buffers
        for _ in range(reps):
            start = time.perf_counter()
            tp.all_reduce(x)
            times.append(time.perf_counter() - start)
        medians[numel] = float(np.median(times))
    parallel_state.destroy_distributed_environment()
    if rank == 0:
        print(json.dumps(medians), flush=True)


def reply_writer(connect_ip: str) -> None:
    with MessageQueue(1, 0, connect_ip=connect_ip) as mq:
        print(json.dumps(dataclasses.asdict(mq.export_handle())), flush=True)
        mq.wait_until_ready(READY_TIMEOUT_S)
        time.sleep(3600)  # a worker between steps: the test kills it or cuts its link


def watcher(handle_json: str) -> None:
    from minivllm.bench._nodes_ring import handle_from_json
    from minivllm.distributed.peer_watch import PeerWatch
    lost = threading.Event()
    with MessageQueue.create_from_handle(handle_from_json(handle_json), 0) as mq:
        mq.wait_until_ready(READY_TIMEOUT_S)
        watch = PeerWatch({"worker": mq.remote_socket}, lambda *_: lost.set())
        print("watching", flush=True)
        heard = lost.wait(WATCH_TIMEOUT_S)
        print(json.dumps({"lost_at": time.time() if heard else None}), flush=True)
        watch.stop()


if __name__ == "__main__":
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "all_reduce":
        all_reduce(int(args[0]), int(args[1]), args[2], args[3], json.loads(args[4]),
                   int(args[5]))
    elif mode == "reply_writer":
        reply_writer(args[0])
    else:
        watcher(args[0])
