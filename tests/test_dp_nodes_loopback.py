"""Data-parallel engine cores on two "nodes" on 127.0.0.1: the leader's LLM(...) runs DP rank
0 and the front end; `minivllm serve --headless --data-parallel-start-rank 1` runs rank 1,
which says HELLO over tcp and then connects to the front end's tcp addresses.
tests/test_dp_nodes_netns.py does it across hosts, through the API server."""

import signal
import subprocess
import sys
import time

import psutil
import pytest

from minivllm.distributed.parallel_state import get_open_port
from minivllm.engine.config import EngineConfig
from minivllm.engine.exceptions import EngineDeadError
from minivllm.entrypoints import serve
from minivllm.entrypoints.llm import LLM
from minivllm.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
DEAD_WITHIN_S = 60.0  # a hang check only; the measured delay is printed (heartbeat: ~3-4 s)


def dp_flags(port: int) -> list[str]:
    return ["-dp", "2", "--data-parallel-size-local", "1", "--data-parallel-address",
            "127.0.0.1", "--data-parallel-rpc-port", str(port), "--num-threads", "1"]


def headless(model: str, port: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "minivllm.cli", "serve", model, "--headless",
         "--data-parallel-start-rank", "1", *dp_flags(port)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def leader(model: str, port: int) -> LLM:
    return LLM(model, data_parallel_size=2, data_parallel_size_local=1,
               data_parallel_rpc_port=port, num_threads=1)


def remote_engine(node: subprocess.Popen) -> psutil.Process:
    (engine,) = [p for p in psutil.Process(node.pid).children()
                 if "EngineCore_1" in " ".join(p.cmdline()) + p.name()]
    return engine


def stop(node: subprocess.Popen) -> str:
    if node.poll() is None:
        node.kill()
    return node.communicate()[0]


def test_rank_1_on_a_headless_node_serves_and_leaves_with_the_leader(tiny_dir):
    port = get_open_port()
    node = headless(tiny_dir, port)
    try:
        with leader(tiny_dir, port) as llm:
            client = llm.engine_core
            assert [r.engine_index for r in client.ready_responses] == [0, 1]
            assert client.call_utility_all("echo", "hi") == ["hi", "hi"]  # by identity
            remote_engine(node)  # rank 1 runs under the headless node, not under us
            # the same prompt on both engines (least loaded: one each) gives the same tokens
            outs = llm.generate(["The capital of France is"] * 2, GREEDY, use_tqdm=False)
            assert outs[0].outputs[0].token_ids == outs[1].outputs[0].token_ids
        out, _ = node.communicate(timeout=60)  # the leader left: the node's engine follows
        assert node.returncode == 0, out
        assert "lost its front end" in out
    finally:
        stop(node)


def test_a_silent_remote_engine_fails_generate_after_the_heartbeat(tiny_dir):
    """SIGSTOP: the engine's process, and its libzmq threads, stop answering, and no FIN is
    sent, as when its host or link vanishes (test_dp_nodes_netns.py does kill -9)."""
    port = get_open_port()
    node = headless(tiny_dir, port)
    try:
        with leader(tiny_dir, port) as llm:
            engine = remote_engine(node)
            engine.suspend()
            try:
                stopped = time.monotonic()
                while not llm.engine_core.errored and time.monotonic() - stopped < DEAD_WITHIN_S:
                    time.sleep(0.005)
                print(f"silent remote engine -> EngineDeadError in "
                      f"{time.monotonic() - stopped:.2f} s")
                with pytest.raises(EngineDeadError, match="connection to tcp://.* closed or fe"):
                    llm.generate(["The capital"], GREEDY, use_tqdm=False)
            finally:
                engine.kill()  # we stopped it; it cannot leave by itself
        node.communicate(timeout=60)
        assert node.returncode == 1  # its engine died: the node says so
    finally:
        stop(node)


def test_a_headless_dp_node_without_its_leader_exits_clean_on_sigterm(tiny_dir):
    node = headless(tiny_dir, get_open_port())
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not psutil.Process(node.pid).children():
            time.sleep(0.05)  # its engine runs and waits for the leader's addresses
        node.send_signal(signal.SIGTERM)
        out, _ = node.communicate(timeout=60)
        assert node.returncode == 0, out
    finally:
        stop(node)


@pytest.mark.parametrize("kwargs, message", [
    (dict(data_parallel_size=2, data_parallel_size_local=3),
     r"data_parallel_size_local \(3\) must be <= data_parallel_size \(2\)"),
    (dict(data_parallel_size=2, data_parallel_size_local=1, data_parallel_start_rank=2),
     r"data_parallel_rank \(2\) must be in the range \[0, 2\)"),
    (dict(data_parallel_size=2, data_parallel_size_local=2, data_parallel_start_rank=1,
          headless=True), r"use a start rank in 0..0"),
    (dict(data_parallel_size=2, data_parallel_rpc_port=0), "must be a TCP port"),
    (dict(data_parallel_size=2, tensor_parallel_size=3, nnodes=3), "whole DP replicas"),
])
def test_bad_dp_node_flags_say_what_works(tiny_dir, kwargs, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(model=tiny_dir, **kwargs)


@pytest.mark.parametrize("flags, message", [
    (["-dp", "2", "--nnodes", "2", "--node-rank", "1"], "add --headless"),
    (["--headless", "-dp", "2"], "a headless node runs the TP workers"),
    (["--headless", "-dp", "2", "-dpl", "1", "-dpr", "1", "--api-server-count", "2"],
     "cannot be used with --headless"),
])
def test_serve_refuses_misplaced_dp_nodes(tiny_dir, flags, message):
    """In this process: serve checks the flags before it starts or binds anything."""
    with pytest.raises(SystemExit, match=message):
        serve.main([tiny_dir, *flags])
