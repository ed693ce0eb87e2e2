"""Where the data-parallel engines run and who sends them requests: the DP flags resolved as
vLLM 0.33.0 resolves them (EngineArgs.create_engine_config, vllm/engine/arg_utils.py:2380-2520).

Three ways to put DP=N engines behind HTTP (the launch modes):

    internal   one front end (on the leader, DP rank 0) sends to all N engines; the other
               nodes run `serve --headless` (engines only), reached over tcp
    hybrid     every node runs API servers for its own engines (`-dpl L -dpr S`, no
               --headless): a load balancer outside spreads requests over the nodes, each
               node spreads its share over its L engines
    external   one engine per front end (`--data-parallel-external-lb` or `-dpn R`): the
               load balancer outside picks the engine

With nnodes > 1 and data_parallel_size > 1, nnodes spans the whole DP x TP deployment: a node
holds (N x TP) / nnodes ranks, so data_parallel_size_local and the start rank follow from
node_rank. minivllm places whole DP replicas on nodes; a replica whose TP ranks span nodes
while DP spans them too is refused (vLLM runs it).

vLLM's rank-0 front end still hears every engine in hybrid and external mode (its DP
coordinator, and MoE's collectives across DP, need them: vllm/v1/engine/utils.py:1320-1359);
minivllm has neither, so there each node is self-contained: its engines say HELLO over ipc
to their own front end.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)


def resolve_dp_layout(c: Any) -> None:
    """Fill c's data_parallel_size_local, start rank, rank, LB mode and address (c is an
    EngineConfig being validated)."""
    dp, tp, n = c.data_parallel_size, c.tensor_parallel_size, c.nnodes
    if c.data_parallel_hybrid_lb and c.data_parallel_external_lb:
        raise ValueError("data_parallel_hybrid_lb and data_parallel_external_lb cannot be "
                         "enabled together: pick one load-balancing mode")
    external = c.data_parallel_external_lb or c.data_parallel_rank is not None
    inferred = _infer_from_node_rank(c, external) if n > 1 and dp > 1 else 0
    if external:
        _external(c, inferred)
    elif c.data_parallel_size_local is not None:
        if c.data_parallel_hybrid_lb and c.data_parallel_size_local == 1:
            logger.warning("hybrid load balancing with data_parallel_size_local 1 is external "
                           "load balancing: switching to it (as vLLM does)")
            c.data_parallel_hybrid_lb, c.data_parallel_rank = False, c.data_parallel_start_rank
            _external(c, inferred)
        if c.data_parallel_size_local == dp:
            c.data_parallel_hybrid_lb = False  # one node holds them all
        if c.data_parallel_start_rank is None:
            c.data_parallel_start_rank = inferred
    else:
        if c.data_parallel_hybrid_lb:
            raise ValueError("hybrid load balancing needs data_parallel_size_local "
                             "(--data-parallel-size-local / -dpl): the DP engines on this node")
        c.data_parallel_size_local = dp - (c.data_parallel_start_rank or 0)
    if c.data_parallel_start_rank is None:
        c.data_parallel_start_rank = 0
    if c.data_parallel_address is None:
        c.data_parallel_address = c.master_addr


def _infer_from_node_rank(c: Any, external: bool) -> int:
    """nnodes over DP x TP: this node's first DP rank (and, internal or hybrid, how many
    engines it runs) from node_rank."""
    dp, tp, n = c.data_parallel_size, c.tensor_parallel_size, c.nnodes
    world = dp * tp
    if world % n:
        raise ValueError(f"nnodes {n} must evenly divide the total world size {world} "
                         f"(data_parallel_size {dp} x tensor_parallel_size {tp})")
    local_world = world // n
    if local_world % tp:
        raise ValueError(
            f"nnodes {n} over DP {dp} x TP {tp} puts {local_world} ranks on a node, part of "
            f"a replica: minivllm spreads whole DP replicas over nodes (TP within a node) or "
            f"one replica's TP ranks (data_parallel_size 1), not both. Use nnodes dividing {dp}")
    inferred = c.node_rank * local_world // tp
    if external and c.data_parallel_rank is None:
        if n % dp:
            raise ValueError(f"node_rank cannot name an external-LB DP rank when nnodes ({n}) "
                             f"is not a multiple of data_parallel_size ({dp}): give each "
                             "front end its --data-parallel-rank")
        c.data_parallel_rank = inferred
    elif not external and c.data_parallel_size_local is None:
        c.data_parallel_size_local = local_world // tp
    logger.info("node_rank %d: DP rank %d onwards", c.node_rank, inferred)
    return inferred


def _external(c: Any, inferred: int) -> None:
    if c.data_parallel_rank is None:
        if c.data_parallel_size > 1:
            raise ValueError("external load balancing needs this front end's DP rank: give "
                             "--data-parallel-rank, or --nnodes and --node-rank to infer it")
        c.data_parallel_rank = inferred
    if c.data_parallel_size_local not in (None, 1):
        raise ValueError("an external-LB front end runs one engine: data_parallel_size_local "
                         f"must be 1 or unset, got {c.data_parallel_size_local}")
    if not 0 <= c.data_parallel_rank < c.data_parallel_size:
        raise ValueError(f"data_parallel_rank must be in 0..{c.data_parallel_size - 1}, got "
                         f"{c.data_parallel_rank}")
    c.data_parallel_external_lb, c.data_parallel_hybrid_lb = True, False
    c.data_parallel_size_local, c.data_parallel_start_rank = 1, c.data_parallel_rank
