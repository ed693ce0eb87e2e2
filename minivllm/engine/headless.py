"""A node that runs data-parallel engine cores for a front end on another node:
`minivllm serve --headless -dp N --data-parallel-size-local L --data-parallel-start-rank S
--data-parallel-address A --data-parallel-rpc-port P` (vLLM: run_headless,
vllm/entrypoints/cli/serve.py (run_headless), with a CoreEngineProcManager whose start_index is S).

    leader (DP rank 0..)                          this node (ranks S .. S+L-1)
    handshake ROUTER tcp://A:P   <── HELLO ────   each engine's DEALER, identity = its rank
                                 ── addresses ─>  tcp://A:<port> of every front end
    front end ROUTER/PULL        <── DEALER, PUSH (heartbeats both ways)

The engines outlive nothing: each one watches its connections to the front end
(core_io.py), and leaves when they close or fall silent (the leader exited, died, or its link
went down), so the node exits 0 once its engines are gone. SIGTERM or SIGINT stops them (exit
0), also while they still wait for the leader; an engine that fails makes the node exit 1, as
does a leader that does not answer HELLO within messages.ADDRESSES_TIMEOUT_S (60 s): start the
leader within a minute of its headless nodes.
"""

from __future__ import annotations

import logging
import os
import signal

from minivllm.engine.config import EngineConfig
from minivllm.engine.launcher import start_engine_procs
from minivllm.executor.multinode import wait_node_procs
from minivllm.utils.zmq import tcp_address

logger = logging.getLogger(__name__)


def run_headless_engines(config: EngineConfig) -> int:
    """Start this node's engine cores and wait until they end or SIGTERM/SIGINT comes; 0 when
    they ended because the leader went away or a signal asked, 1 when one failed."""
    if not config.data_parallel_multinode or config.data_parallel_start_rank == 0:
        raise ValueError(
            "a headless node runs the TP workers of a multi-node group (--nnodes K --node-rank "
            "R >= 1), or data-parallel engines for a leader elsewhere (-dp N "
            "--data-parallel-size-local L < N --data-parallel-start-rank S >= 1 "
            f"--data-parallel-address A); got -dp {config.data_parallel_size} "
            f"--data-parallel-size-local {config.data_parallel_size_local} "
            f"--data-parallel-start-rank {config.data_parallel_start_rank}")
    handshake = tcp_address(config.data_parallel_address, config.data_parallel_rpc_port)
    stop_r, stop_w = os.pipe()
    old = {sig: signal.signal(sig, lambda *_: os.write(stop_w, b"x"))
           for sig in (signal.SIGINT, signal.SIGTERM)}
    manager = None
    try:
        manager = start_engine_procs(config, handshake)
        first = config.data_parallel_start_rank
        print(f"minivllm serve --headless: DP ranks {first}..{first + len(manager.handles) - 1}"
              f" of {config.data_parallel_size} say HELLO to {handshake}", flush=True)
        return wait_node_procs(manager.handles, stop_r)
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        if manager is not None:
            manager.close()
        os.close(stop_r)
        os.close(stop_w)
