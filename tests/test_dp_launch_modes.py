"""The DP flags resolved as vLLM 0.33.0 resolves them, through EngineConfig (engine/dp_nodes.py,
in this process: no engine starts): --nnodes over DP x TP, the three launch modes, -dpa's
default, and the errors that name what works. Every flag combination against vLLM's outcome:
test_dp_flags_conformance.py; the modes' runs across namespace hosts: test_dp_modes_netns.py."""

from __future__ import annotations

import pytest

from minivllm.engine.config import EngineConfig
from minivllm.entrypoints import serve
from minivllm.entrypoints.node_flags import api_server_count


def config(tiny_dir: str, *flags: str) -> EngineConfig:
    return serve.engine_config(serve.make_parser().parse_args([tiny_dir, *flags]))


@pytest.mark.parametrize("node_rank, start", [(0, 0), (1, 1)])
def test_nnodes_spans_dp_x_tp_and_the_dp_rank_follows_from_the_node_rank(tiny_dir_tp2,
                                                                          node_rank, start):
    c = config(tiny_dir_tp2, "-dp", "2", "-tp", "2", "--nnodes", "2", "--node-rank",
               str(node_rank), "--master-addr", "10.0.0.1")
    assert (c.data_parallel_size_local, c.data_parallel_start_rank) == (1, start)
    assert (c.nnodes_within_dp, c.local_world_size) == (1, 2)  # each replica's TP on one node
    assert c.data_parallel_address == "10.0.0.1"  # -dpa defaults to --master-addr, as in vLLM
    assert c.data_parallel_multinode and not c.local_engines_only
    assert list(c.client_engine_ranks) == [0, 1]


def test_nnodes_with_two_replicas_a_node(tiny_dir):
    c = config(tiny_dir, "-dp", "4", "--nnodes", "2", "--node-rank", "1")
    assert (c.data_parallel_size_local, c.data_parallel_start_rank) == (2, 2)


def test_dp_1_keeps_tp_across_nodes(tiny_dir_tp2):
    c = config(tiny_dir_tp2, "-tp", "2", "--nnodes", "2", "--node-rank", "1")
    assert (c.nnodes_within_dp, c.node_rank_within_dp, c.local_world_size) == (2, 1, 1)


def test_dpr_without_headless_is_hybrid_load_balancing(tiny_dir):
    args = serve.make_parser().parse_args([tiny_dir, "-dp", "4", "-dpl", "2", "-dpr", "2"])
    c = serve.engine_config(args)
    assert c.data_parallel_hybrid_lb and c.local_engines_only and not c.data_parallel_multinode
    assert list(c.client_engine_ranks) == [2, 3]
    assert api_server_count(args, c) == 2  # vLLM's default: the local engines


def test_hybrid_with_one_local_engine_becomes_external(tiny_dir):
    c = config(tiny_dir, "-dp", "2", "-dpl", "1", "-dpr", "1")
    assert c.data_parallel_external_lb and not c.data_parallel_hybrid_lb
    assert list(c.client_engine_ranks) == [1]


@pytest.mark.parametrize("flags", [["-dpe", "--nnodes", "2", "--node-rank", "1"], ["-dpn", "1"],
                                   ["-dpe", "-dpn", "0"]])
def test_explicit_external_load_balancing_is_for_moe_models_only(tiny_dir, flags):
    with pytest.raises(ValueError, match="Non-MoE models do not support external"):
        config(tiny_dir, "-dp", "2", *flags)


def test_replace_resolves_the_flags_as_given_again(tiny_dir):
    c = config(tiny_dir, "-dp", "4", "--nnodes", "2", "--node-rank", "0")
    again = c.replace(max_num_seqs=8)  # start rank 0 and -dpl 2, resolved: still internal
    assert not again.local_engines_only and again.data_parallel_size_local == 2
    ext = config(tiny_dir, "-dp", "2", "-dpl", "1", "-dpr", "1").replace(max_num_seqs=8)
    assert ext.data_parallel_external_lb and list(ext.client_engine_ranks) == [1]


def test_headless_with_dpr_stays_internal(tiny_dir):
    c = config(tiny_dir, "--headless", "-dp", "2", "-dpl", "1", "-dpr", "1")
    assert not c.local_engines_only and c.data_parallel_multinode


@pytest.mark.parametrize("kwargs, message", [
    (dict(data_parallel_size=2, data_parallel_hybrid_lb=True, data_parallel_external_lb=True),
     "cannot be enabled together"),
    (dict(data_parallel_size=1, data_parallel_external_lb=True), "requires a data-parallel rank"),
    (dict(data_parallel_size=4, data_parallel_hybrid_lb=True),
     "requires --data-parallel-size-local"),
    (dict(data_parallel_size=3, nnodes=2), "evenly divide the total world size 3"),
    (dict(data_parallel_size=4, nnodes=3), "evenly divide"),
    (dict(data_parallel_size=2, nnodes=6, tensor_parallel_size=3), "whole DP replicas"),
    (dict(distributed_timeout_seconds=0), "must be positive"),
    (dict(cpu_distributed_timeout_seconds=-1), "must be positive"),
])
def test_bad_launch_modes_say_what_works(tiny_dir, kwargs, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(model=tiny_dir, **kwargs)


def test_headless_refuses_hybrid(tiny_dir):
    with pytest.raises(SystemExit, match="not applicable in headless mode"):
        serve.main([tiny_dir, "--headless", "-dp", "2", "-dph", "-dpl", "1"])


def test_the_group_timeout_takes_the_cpu_flag_when_the_other_is_unset(tiny_dir):
    assert config(tiny_dir, "--cpu-distributed-timeout-seconds", "7").collective_timeout_s == 7
    assert config(tiny_dir, "--cpu_distributed_timeout_seconds=7",
                  "--distributed-timeout-seconds", "9").collective_timeout_s == 9
