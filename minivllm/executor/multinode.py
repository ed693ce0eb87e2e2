"""The workers of one node, and a node that runs nothing else (`minivllm serve --headless`).

Multi-node tensor parallelism splits the TP ranks evenly over `nnodes` nodes (vLLM:
ParallelConfig in vllm/config/parallel.py, local_world_size = world_size // nnodes). The leader (node
0) runs the engine core, whose MultiprocExecutor starts ranks 0..L-1 with start_node_workers.
Every other node runs run_headless, which starts its own L ranks and waits (vLLM:
run_headless in vllm/entrypoints/cli/serve.py, a MultiprocExecutor without a ring
that monitors its workers inline). How the ranks find each other: worker/multinode.py.

A headless node ends when its workers end: the leader's shutdown (or death, or a cut link)
closes the ring's tcp connection and the workers leave (exit 0); SIGTERM or SIGINT stops them
(exit 0), also while they still wait for the leader; a worker that dies on its own stops the
rest (exit 1).
"""

from __future__ import annotations

import logging
import multiprocessing.connection
import os
import signal

import psutil

from minivllm.distributed.parallel_state import get_open_port
from minivllm.distributed.shm_broadcast import Handle
from minivllm.engine.config import EngineConfig
from minivllm.executor.proc_group import launch_all, stop_all, worker_mp_context
from minivllm.utils.mp import ChildStartError, ProcHandle, launch
from minivllm.worker.worker_proc import READY_TIMEOUT_S, worker_main

logger = logging.getLogger(__name__)


def start_node_workers(config: EngineConfig, broadcast_handle: Handle | None) -> list[ProcHandle]:
    """This node's workers (ranks node_rank * L .. + L-1), started side by side; each one's
    ready message maps ranks to reply Handles. One node: the group meets on a free loopback
    port. Several: at master_addr:master_port, and a worker is ready only once every node's
    workers joined. The start window is the rendezvous: every node must join within
    --distributed-timeout-seconds (60 s by default), or the group fails on the nodes that
    came (tests/test_failure_timing.py); the ready wait covers that and the model load."""
    local = config.local_world_size
    first = config.node_rank_within_dp * local
    if config.nnodes_within_dp > 1:
        init_method = f"tcp://{config.master_addr}:{config.master_port}"
        ready_timeout = config.collective_timeout_s + READY_TIMEOUT_S
    else:
        init_method, ready_timeout = f"tcp://127.0.0.1:{get_open_port()}", READY_TIMEOUT_S
    context = worker_mp_context()

    def start(i: int) -> ProcHandle:
        return launch(worker_main, f"Worker_TP{first + i}", ready_timeout=ready_timeout,
                      args=(config, first + i, broadcast_handle, init_method), context=context)

    return launch_all(start, local, context)


def run_headless(config: EngineConfig) -> int:
    """Start this node's workers and wait until they end or SIGTERM/SIGINT comes; 0 when
    they ended because the leader went away or a signal asked, 1 when one died on its own."""
    if config.nnodes_within_dp < 2 or config.node_rank_within_dp < 1:
        raise ValueError("a headless node is one of the other nodes of a multi-node group: "
                         f"give nnodes >= 2 and node_rank >= 1 (got nnodes={config.nnodes}, "
                         f"node_rank={config.node_rank}, {config.nnodes_within_dp} node(s) "
                         "per DP replica)")
    stop_r, stop_w = os.pipe()
    started = False

    def on_signal(*_: object) -> None:
        os.write(stop_w, b"x")
        if not started:  # the workers wait for the leader inside gloo's C++ rendezvous,
            for child in psutil.Process().children():  # deaf to SIGTERM: kill; launch fails
                try:
                    if "Worker_TP" in " ".join(child.cmdline()):  # they hold no shm yet
                        child.kill()
                except psutil.Error:
                    pass  # it exited meanwhile

    old = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    procs: list[ProcHandle] = []
    try:
        try:
            procs = start_node_workers(config, None)
        except ChildStartError:
            if _stop_requested(stop_r):
                return 0  # stopped while waiting for the leader
            raise
        started = True
        logger.info("headless node %d: ranks %s joined the group at %s:%d", config.node_rank,
                    [p.name for p in procs], config.master_addr, config.master_port)
        print(f"minivllm serve --headless: node {config.node_rank} of {config.nnodes} runs "
              f"{len(procs)} worker(s); waiting for the leader", flush=True)
        return wait_node_procs(procs, stop_r)
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        stop_all(procs)
        os.close(stop_r)
        os.close(stop_w)


def _stop_requested(stop_r: int) -> bool:
    return bool(multiprocessing.connection.wait([stop_r], 0))


def wait_node_procs(procs: list[ProcHandle], stop_r: int) -> int:
    """Until every process exited (the leader is gone) or a signal came; 1 if one failed
    (also the wait of a headless node's DP engines, engine/headless.py)."""
    alive = list(procs)
    while alive:
        ready = multiprocessing.connection.wait([p.sentinel for p in alive] + [stop_r])
        if stop_r in ready:
            return 0
        for p in [p for p in alive if p.sentinel in ready]:
            code = p.exit_code(timeout=1.0)
            if code:
                logger.error("%s exited with code %s: stopping this node", p.name, code)
                print(f"minivllm serve --headless: {p.name} exited with code {code}",
                      flush=True)
                return 1
            alive.remove(p)
    return 0
