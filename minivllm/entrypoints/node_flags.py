"""`minivllm serve`'s multi-node and data-parallel flags, with vLLM 0.33.0's spellings and short
forms (EngineArgs.add_cli_args, vllm/engine/arg_utils.py:1175-1300; --headless and -asc:
vllm/entrypoints/common/cli_args.py:444-457; -dph and -dpe take vLLM's --no- forms,
arg_utils.py:384-386), and vLLM's parser rule that `--a_b` means
`--a-b` (FlexibleArgumentParser, vllm/utils/argparse_utils.py:157, 375-394). What the flags
resolve to is decided in one place, minivllm/engine/dp_nodes.py."""

from __future__ import annotations

import argparse
import sys
from types import SimpleNamespace
from typing import Any, Sequence

from minivllm.engine.dp_nodes import NodeLayout, node_layout, resolve_dp_layout, serve_api_servers

# the flags (argparse's names) that resolve_dp_layout reads, besides headless
LAYOUT_FLAGS = ("data_parallel_size", "tensor_parallel_size", "nnodes", "node_rank",
                "master_addr", "data_parallel_size_local", "data_parallel_start_rank",
                "data_parallel_rank", "data_parallel_hybrid_lb", "data_parallel_external_lb",
                "data_parallel_address", "data_parallel_backend")


class FlexibleArgumentParser(argparse.ArgumentParser):
    """An ArgumentParser that takes `--data_parallel_size_local` for
    `--data-parallel-size-local`: underscores in a long flag's name (before any `=`) become
    dashes, as in vLLM."""

    def parse_known_args(self, args: Sequence[str] | None = None,
                         namespace: Any = None) -> tuple[argparse.Namespace, list[str]]:
        args = [dashed(a) for a in (sys.argv[1:] if args is None else args)]
        return super().parse_known_args(args, namespace)


def dashed(arg: str) -> str:
    """`--a_b=c_d` -> `--a-b=c_d`; values and short flags unchanged."""
    if not arg.startswith("--"):
        return arg
    name, eq, value = arg.partition("=")
    head, dot, rest = name.partition(".")
    return head.replace("_", "-") + dot + rest + eq + value


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
                        "seconds: every node must join within it (minivllm's default 60; "
                        "vLLM's is None, torch's own default)")
    g.add_argument("--cpu-distributed-timeout-seconds", type=int, default=None, metavar="S",
                   help="vLLM's timeout for its gloo (CPU) groups; minivllm's group is gloo, "
                        "so it takes S when --distributed-timeout-seconds is not given")
    g.add_argument("--headless", action="store_true",
                   help="no API server (as --api-server-count 0): run this node's TP workers "
                        "(nodes 1..nnodes-1) or DP engines for the front end on DP rank 0's "
                        "node; exits when the leader goes away, or on SIGTERM")
    d = p.add_argument_group("data-parallel engines on several nodes (vLLM's flags)")
    d.add_argument("-dpl", "--data-parallel-size-local", type=int, default=None,
                   help="DP engines on this node (default: -dp; with --nnodes and no -dpe, "
                        "vLLM's max(DP x TP / nnodes // TP, 1) replicas)")
    d.add_argument("-dpr", "--data-parallel-start-rank", type=int, default=None,
                   help="the first DP rank on this node, read only when -dpl is given or "
                        "--nnodes infers it (else the engines start at rank 0). Without "
                        "--headless: hybrid load balancing (with -dpl 1: external); without "
                        "-dpl too, serve still counts API servers as hybrid (default 1) and "
                        "refuses it with -dpe/-dpn, as vLLM does")
    d.add_argument("-dpn", "--data-parallel-rank", type=int, default=None,
                   help="this API server's one DP engine: external load balancing, for MoE "
                        "models only as in vLLM (minivllm's are dense: use -dpl 1 -dpr R)")
    d.add_argument("-dph", "--data-parallel-hybrid-lb", action=argparse.BooleanOptionalAction,
                   default=False,
                   help="API servers on every node, each node's in front of its engines "
                        "(needs -dpl, given or inferred from --nnodes)")
    d.add_argument("-dpe", "--data-parallel-external-lb", action=argparse.BooleanOptionalAction,
                   default=False,
                   help="one engine per API server, a load balancer outside spreading requests; "
                        "as -dpn: MoE models and -dp > 1 only (dense: -dpl 1 -dpr R)")
    d.add_argument("-dpm", "--data-parallel-multi-port-external-lb", action="store_true",
                   help="vLLM's supervisor of one external-LB API server per local rank: "
                        "minivllm refuses it (run one serve -dpl 1 -dpr R per rank)")
    d.add_argument("-dpa", "--data-parallel-address", default=None,
                   help="the leader's address, as every node reaches it (default: "
                        "--master-addr)")
    d.add_argument("-dpp", "--data-parallel-rpc-port", type=int, default=None,
                   help="the leader's handshake port (default 29550)")
    d.add_argument("-dpb", "--data-parallel-backend", default="mp",
                   help="how DP engines start: mp (processes; the only one minivllm has) or "
                        "ray (vLLM's engines as Ray actors: refused)")


def api_server_count(args: argparse.Namespace, config: Any = None) -> int:
    """The API servers serve runs (0: headless), as vLLM decides it from the flags alone
    (dp_nodes.serve_api_servers); `config` is not needed and kept for old callers."""
    return serve_api_servers(args)


def resolve_node(args: argparse.Namespace, is_moe: bool = False) -> NodeLayout:
    """What `minivllm serve` runs on this node for these flags, by serve's own steps
    (serve_api_servers, resolve_dp_layout, node_layout) and without reading a model: a dense
    model unless is_moe. Raises ValueError where serve refuses."""
    count = serve_api_servers(args)
    c = SimpleNamespace(**{name: getattr(args, name) for name in LAYOUT_FLAGS},
                        headless=count < 1)
    resolve_dp_layout(c, is_moe=is_moe)
    return node_layout(c, count)
