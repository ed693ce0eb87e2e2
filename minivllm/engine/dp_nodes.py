"""Where the data-parallel engines run and who sends them requests: vLLM 0.33.0's DP and
API-server flags, resolved in vLLM's three steps and in its order (paths in the vllm wheel):

    serve_api_servers(args)     `vllm serve`'s step (ServeSubcommand.cmd,
                                entrypoints/cli/serve.py:69-129): one load-balancing mode at
                                most, and the API-server count (0: headless)
    resolve_dp_layout(c)        EngineArgs.create_engine_config
                                (engine/arg_utils.py:2380-2535) and ParallelConfig's checks
                                (config/parallel.py:545-554, 1017-1021): this node's engines,
                                their first DP rank, the LB mode, the DP address
    node_layout(c, api_servers) what the node then runs (serve.py:181-203, 218, 325;
                                v1/engine/utils.py:1142-1156): engines, API servers, transport

The launch modes (DP=N engines behind HTTP):

    internal   one front end (DP rank 0's node) sends to all N engines; the other nodes run
               `serve --headless` (engines only), reached over tcp
    hybrid     API servers on every node for its own engines (-dph, or -dpr with -dpl and no
               --headless): a load balancer outside spreads requests over the nodes
    external   one engine per front end (-dpe, or -dpn R; or hybrid with -dpl 1): the load
               balancer outside picks the engine. -dpe/-dpn are for MoE models only
               (arg_utils.py:2456-2465); -dpl 1 -dpr R reaches it for any model, because that
               check runs before hybrid switches to external (:2493-2501)

Where minivllm stops short of vLLM, it refuses and names the flag (minivllm_limits, and -dpm in
serve_api_servers): no DP engines as Ray actors (-dpb ray), no multi-port supervisor (-dpm), no
front end without engines (-dpl 0), nnodes over DP x TP only in whole replicas. The table
tests/dp_flags_conformance.py holds vLLM's outcome for 69 flag combinations. vLLM's rank-0
front end handshakes with every engine at startup in every mode (v1/engine/utils.py:1319-1326);
after that it hears them through its DP coordinator in hybrid mode or for an MoE model, while a
dense model in external mode (-dpl 1 -dpr R) has no coordinator (config/vllm.py:886-892).
minivllm has no coordinator, so each node of a hybrid or external deployment is self-contained.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

# the fields resolve_dp_layout reads as flags and overwrites with what they resolve to
DP_FLAGS = ("data_parallel_size_local", "data_parallel_start_rank", "data_parallel_rank",
            "data_parallel_hybrid_lb", "data_parallel_external_lb", "data_parallel_address")
MANY_MODES = ("Cannot use more than one data parallel load balancing mode. Choose one of: "
              "--data-parallel-multi-port-external-lb, --data-parallel-external-lb (or "
              "--data-parallel-rank), --data-parallel-hybrid-lb (or --data-parallel-start-rank).")


def serve_api_servers(args: Any) -> int:
    """The API servers `serve` runs for these flags, 0 for headless (cli/serve.py:69-129)."""
    if getattr(args, "data_parallel_multi_port_external_lb", False):
        raise ValueError("--data-parallel-multi-port-external-lb (-dpm): minivllm has no "
                         "multi-port supervisor (vLLM's dp_supervisor): start one `minivllm "
                         "serve -dpl 1 -dpr R --port P` per local DP rank instead")
    count = args.api_server_count
    if args.headless:  # :69-77
        if count is not None and count > 0:
            raise ValueError(f"--api-server-count={count} cannot be used with --headless: a "
                             "headless node starts no API server")
        count = 0
    external = args.data_parallel_external_lb or args.data_parallel_rank is not None
    hybrid = args.data_parallel_hybrid_lb or args.data_parallel_start_rank is not None
    if external and hybrid:  # :99-105 (-dpm, the third mode, is refused above)
        raise ValueError(MANY_MODES)
    if count is not None:
        return max(count, 0)  # below 1: headless (:149-150)
    if external:  # :112-129
        return 1
    if hybrid:  # -dpl as typed, not as --nnodes infers it
        return args.data_parallel_size_local or 1
    return args.data_parallel_size


def resolve_dp_layout(c: Any, is_moe: bool = False) -> None:
    """Fill c's data_parallel_size_local, start rank, rank, LB mode and address as
    create_engine_config does (c: an EngineConfig being validated, c.headless set when serve
    starts no API server)."""
    dp = c.data_parallel_size
    if c.headless and c.data_parallel_hybrid_lb:  # :2380-2382
        raise ValueError("data_parallel_hybrid_lb is not applicable in headless mode")
    if c.data_parallel_hybrid_lb and c.data_parallel_external_lb:  # :2383-2389
        raise ValueError("--data-parallel-hybrid-lb and --data-parallel-external-lb cannot be "
                         "enabled together: enable one load-balancing mode")
    if c.nnodes > 1 and c.data_parallel_backend != "mp":  # :2390-2397
        raise ValueError(f"--nnodes {c.nnodes} requires --data-parallel-backend mp, got "
                         f"{c.data_parallel_backend}")
    inferred = _infer_from_node_rank(c) if c.nnodes > 1 else 0
    external = c.data_parallel_external_lb or c.data_parallel_rank is not None  # :2447-2449
    if dp > 1 and external and not is_moe:  # :2456-2465
        raise ValueError("Non-MoE models do not support external data parallel mode "
                         "(--data-parallel-external-lb, --data-parallel-rank): run independent "
                         "servers, or -dpl 1 -dpr R, which vLLM turns into external mode too")
    start, hybrid = c.data_parallel_start_rank, c.data_parallel_hybrid_lb
    if external:  # :2466-2485
        if c.data_parallel_rank is None:
            raise ValueError("--data-parallel-external-lb requires a data-parallel rank: set "
                             "--data-parallel-rank, or -dp > 1 with --nnodes and --node-rank "
                             "to infer it")
        if c.data_parallel_size_local not in (1, None):
            raise ValueError("an external data-parallel rank requires "
                             f"--data-parallel-size-local 1; got {c.data_parallel_size_local}")
        local, rank, hybrid = 1, c.data_parallel_rank, False
    elif c.data_parallel_size_local is not None:  # :2486-2517
        local = c.data_parallel_size_local
        hybrid = hybrid or (start is not None and not c.headless)
        if hybrid and local == 1:
            logger.warning("hybrid load balancing with data_parallel_size_local 1: switching "
                           "to external load balancing (as vLLM does)")
            external, hybrid = True, False
        hybrid = hybrid and local != dp  # one node holds them all
        rank = start if start is not None else inferred
    else:  # :2518-2535
        if hybrid:
            raise ValueError("--data-parallel-hybrid-lb requires --data-parallel-size-local: "
                             "the number of data-parallel ranks on this node")
        if start is not None:
            logger.warning("-dpr %d without -dpl does not set this node's start rank (as in "
                           "vLLM): this node runs DP ranks 0..%d", start, dp - 1)
        local, rank = dp, inferred
    _check_parallel_config(dp, local, rank, external)
    c.data_parallel_size_local, c.data_parallel_start_rank = local, rank
    c.data_parallel_hybrid_lb, c.data_parallel_external_lb = hybrid, external
    c.data_parallel_rank = rank if external else None
    if c.data_parallel_address is None:  # :2538-2552 (mp)
        c.data_parallel_address = c.master_addr
    minivllm_limits(c)


def _infer_from_node_rank(c: Any) -> int:
    """--nnodes over the whole DP x TP world: this node's first DP rank, and (internal or
    hybrid) its engines, from --node-rank (arg_utils.py:2398-2446)."""
    dp, tp, n = c.data_parallel_size, c.tensor_parallel_size, c.nnodes
    world = dp * tp
    if world % n:
        raise ValueError(f"--nnodes {n} must evenly divide the total world size {world} "
                         f"(data_parallel_size {dp} x tensor_parallel_size {tp})")
    if not 0 <= c.node_rank < n:
        raise ValueError(f"--node-rank must be between 0 and {n - 1}; got {c.node_rank}")
    local_world = world // n
    inferred = c.node_rank * local_world // tp
    if dp > 1 and c.data_parallel_external_lb:
        if c.data_parallel_rank is None:
            if n % dp:
                raise ValueError("--node-rank cannot unambiguously identify external "
                                 f"data-parallel ranks when --nnodes ({n}) is not divisible "
                                 f"by --data-parallel-size ({dp}): set --data-parallel-rank")
            c.data_parallel_rank = inferred
    elif c.data_parallel_size_local is None:
        c.data_parallel_size_local = max(local_world // tp, 1)
    return inferred


def _check_parallel_config(dp: int, local: int, rank: int, external: bool) -> None:
    """ParallelConfig's checks of the result (config/parallel.py:147-154, 545-554, 1017-1021)."""
    if dp < 1:
        raise ValueError(f"data_parallel_size must be greater than or equal to 1, got {dp}")
    if local < 0:
        raise ValueError(f"data_parallel_size_local must be >= 0, got {local}")
    if local > dp:
        raise ValueError(f"data_parallel_size_local ({local}) must be <= data_parallel_size "
                         f"({dp})")
    if dp <= 1 and external:
        raise ValueError("data_parallel_external_lb can only be set when data_parallel_size > 1")
    if (dp > 1 or local == 0) and not 0 <= rank < dp:
        raise ValueError(f"data_parallel_rank ({rank}) must be in the range [0, {dp})")


def minivllm_limits(c: Any) -> None:
    """What vLLM runs and minivllm does not: each refusal names the flag."""
    dp, local, start = c.data_parallel_size, c.data_parallel_size_local, c.data_parallel_start_rank
    if c.data_parallel_backend != "mp":
        raise ValueError(f"--data-parallel-backend {c.data_parallel_backend} (-dpb): minivllm "
                         "starts DP engine cores as processes only (mp); its Ray backend "
                         "places one engine's TP workers (--distributed-executor-backend ray)")
    if local == 0 and c.headless:  # vLLM's run_headless says so too (cli/serve.py:202-203)
        raise ValueError("data_parallel_size_local must be > 0 in headless mode")
    if local == 0:
        raise ValueError("--data-parallel-size-local 0: minivllm runs a front end only on a "
                         "node with engines (vLLM allows an engine-less front end)")
    if start + local > dp:
        raise ValueError(f"data_parallel_start_rank {start} + data_parallel_size_local {local} "
                         f"exceeds data_parallel_size {dp}: this node's ranks must lie in "
                         f"0..{dp - 1}; use a start rank in 0..{dp - local}")
    world, tp = dp * c.tensor_parallel_size, c.tensor_parallel_size
    if c.nnodes > 1 and dp > 1 and (world // c.nnodes) % tp:
        raise ValueError(
            f"nnodes {c.nnodes} over DP {dp} x TP {tp} puts {world // c.nnodes} ranks on a "
            f"node, part of a replica: minivllm spreads whole DP replicas over nodes (TP within "
            f"a node) or one replica's TP ranks (data_parallel_size 1), not both")


@dataclass(frozen=True)
class NodeLayout:
    """What one node runs once its flags are resolved."""

    engines: tuple[int, ...]  # the DP ranks whose engine cores start here
    api_servers: int  # 0: headless
    mode: str  # internal | hybrid | external
    transport: str  # ipc | tcp: between the engines and their front end's API servers
    tp_workers_only: bool = False  # headless node of a replica whose TP spans nodes

    def describe(self) -> str:
        ranks = ", ".join(map(str, self.engines)) or "none"
        if self.tp_workers_only:
            return f"TP workers of DP rank {self.engines[0]} (headless), {self.transport}"
        front = f"{self.api_servers} API server(s)" if self.api_servers else "no API server"
        return f"engines [{ranks}], {front}, {self.mode}, {self.transport}"


def node_layout(c: Any, api_servers: int) -> NodeLayout:
    """The node's processes for a resolved config, as serve starts them; raises where vLLM's
    serve refuses (a front end off DP rank 0 in internal mode, cli/serve.py:325)."""
    start, local, dp = c.data_parallel_start_rank, c.data_parallel_size_local, c.data_parallel_size
    mode = ("external" if c.data_parallel_external_lb else
            "hybrid" if c.data_parallel_hybrid_lb else "internal")
    engines = tuple(range(start, start + local))
    if api_servers < 1:  # run_headless, serve.py:181-203
        if local <= 0:
            raise ValueError("data_parallel_size_local must be > 0 in headless mode")
        nnodes_within_dp = max(c.nnodes * local // dp, 1) if c.nnodes > 1 else 1
        workers = c.node_rank % nnodes_within_dp > 0
        return NodeLayout(engines[:1] if workers else engines, 0, mode, "tcp", workers)
    if start != 0 and not (c.data_parallel_hybrid_lb or c.data_parallel_external_lb):
        raise ValueError(f"--node-rank {c.node_rank} (DP start rank {start}) is not the leader: "
                         "with internal load balancing the API servers run on DP rank 0's node "
                         "only; add --headless, or give -dpl and -dpr for hybrid load balancing")
    local_only = c.data_parallel_hybrid_lb or c.data_parallel_external_lb or local == dp
    return NodeLayout(engines, api_servers, mode, "ipc" if local_only else "tcp")
