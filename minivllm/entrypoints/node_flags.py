"""`minivllm serve`'s multi-node flags (vLLM's names: ParallelConfig in
vllm/config/parallel.py, EngineArgs.add_cli_args in vllm/engine/arg_utils.py:1176-1295) and
the launch-mode choices made from them before a config exists (vLLM makes them in
ServeSubcommand.cmd, vllm/entrypoints/cli/serve.py:79-129)."""

from __future__ import annotations

import argparse
from typing import Any


def add_node_flags(p: argparse.ArgumentParser) -> None:
    """vLLM's multi-node flags (ParallelConfig in vllm/config/parallel.py, mp backend)."""
    g = p.add_argument_group("multi-node (the DP x TP ranks split over nodes)")
    g.add_argument("-n", "--nnodes", type=int, default=1,
                   help="nodes the whole DP x TP deployment is split over")
    g.add_argument("-r", "--node-rank", type=int, default=0,
                   help="this node's rank: 0 is the leader (engine core and API server); with "
                        "-dp > 1 this node's DP ranks follow from it")
    g.add_argument("--master-addr", default="127.0.0.1",
                   help="the leader's address, as every node reaches it")
    g.add_argument("--master-port", type=int, default=29501,
                   help="the process group's rendezvous port on the leader")
    g.add_argument("--distributed-timeout-seconds", type=int, default=None, metavar="S",
                   help="the process group gives up a rendezvous or collective after S "
                        "seconds (default 60): every node must join within it")
    g.add_argument("--headless", action="store_true",
                   help="no API server: run this node's TP workers (nodes 1..nnodes-1) or "
                        "DP engines (--data-parallel-start-rank S >= 1); exits when the "
                        "leader goes away, or on SIGTERM")
    d = p.add_argument_group("data-parallel engines on several nodes (vLLM's flags)")
    d.add_argument("-dpl", "--data-parallel-size-local", type=int, default=None,
                   help="DP engines on this node (default: all of -dp, or from --node-rank)")
    d.add_argument("-dpr", "--data-parallel-start-rank", type=int, default=None,
                   help="the first DP rank on this node; without --headless: hybrid load "
                        "balancing, API servers on this node for its own engines")
    d.add_argument("-dpn", "--data-parallel-rank", type=int, default=None,
                   help="this API server's one DP engine (external load balancing)")
    d.add_argument("-dph", "--data-parallel-hybrid-lb", action="store_true",
                   help="API servers on every node, each node's in front of its engines")
    d.add_argument("-dpe", "--data-parallel-external-lb", action="store_true",
                   help="one engine per API server; a load balancer outside spreads requests")
    d.add_argument("-dpa", "--data-parallel-address", default=None,
                   help="the leader's address, as every node reaches it (default: "
                        "--master-addr)")
    d.add_argument("-dpp", "--data-parallel-rpc-port", type=int, default=None,
                   help="the leader's handshake port (default 29550)")


def hybrid_lb(args: argparse.Namespace) -> bool:
    """-dpr without --headless is hybrid load balancing, as in vLLM (ServeSubcommand.cmd,
    vllm/entrypoints/cli/serve.py:87-97, and vllm/engine/arg_utils.py:2489-2491)."""
    external = args.data_parallel_external_lb or args.data_parallel_rank is not None
    return args.data_parallel_hybrid_lb or (
        args.data_parallel_start_rank is not None and not args.headless and not external)


def api_server_count(args: argparse.Namespace, config: Any) -> int:
    """--api-server-count, or vLLM's default: 1 for external load balancing, the local
    engines for hybrid, the DP size otherwise (vllm/entrypoints/cli/serve.py:107-129)."""
    if args.api_server_count is not None:
        return args.api_server_count
    if config.data_parallel_external_lb:
        return 1
    if config.data_parallel_hybrid_lb:
        return config.data_parallel_size_local
    return config.data_parallel_size
