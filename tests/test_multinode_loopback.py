"""Multi-node tensor parallelism with every "node" on 127.0.0.1: the leader's LLM(...) with
nnodes=3 and two `minivllm serve --headless` processes as nodes 1 and 2 (the tiny model
splits in 1 or 3). The bytes take the multi-node
path (ranks 1 and 2 read the ring as a remote reader over tcp, replies over tcp, the group meets at
master_addr:master_port), on one machine. tests/test_multinode_netns.py does it across hosts."""

import signal
import subprocess
import sys
import time

import psutil
import pytest

from minivllm.distributed.parallel_state import get_open_port
from minivllm.engine.config import EngineConfig
from minivllm.entrypoints import serve
from minivllm.entrypoints.llm import LLM
from minivllm.sampling_params import SamplingParams
from minivllm.utils import netns_cluster

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
PROMPTS = ["The capital of France is", "A paged KV cache"]


def headless(model: str, port: int, node_rank: int, nnodes: int = 3) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "minivllm.cli", "serve", model, "--headless", "-tp", str(nnodes),
         "--nnodes", str(nnodes), "--node-rank", str(node_rank), "--master-port", str(port),
         "--num-threads", "1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def tokens(llm: LLM) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


@pytest.mark.skipif(netns_cluster.unavailable() is None,
                    reason="test_multinode_netns.py runs the same path across separate hosts")
def test_three_nodes_on_loopback_give_one_nodes_tokens_and_headless_nodes_exit_clean(tiny_dir):
    with LLM(tiny_dir, tensor_parallel_size=3, num_threads=1) as llm:
        expected = tokens(llm)
    port = get_open_port()
    nodes = [headless(tiny_dir, port, rank) for rank in (1, 2)]
    try:
        with LLM(tiny_dir, tensor_parallel_size=3, nnodes=3, master_port=port,
                 num_threads=1) as llm:
            assert tokens(llm) == expected  # the same sums, another transport
        for node in nodes:  # the leader left: the other nodes' workers follow
            out, _ = node.communicate(timeout=60)
            assert node.returncode == 0, out
            assert "lost the leader's broadcast" in out
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()
                node.communicate()


@pytest.mark.parametrize("kwargs, message", [
    (dict(tensor_parallel_size=3, nnodes=2), r"cannot be split evenly over nnodes=2: use "
                                             r"nnodes in \[1, 3\]"),
    (dict(tensor_parallel_size=3, nnodes=3, node_rank=3), "0 <= node_rank < nnodes"),
    (dict(tensor_parallel_size=3, nnodes=3, distributed_executor_backend="uni"),
     "needs distributed_executor_backend='mp'"),
])
def test_bad_node_flags_say_what_works(tiny_dir, kwargs, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(model=tiny_dir, **kwargs)


def test_serve_refuses_a_non_leader_without_headless(tiny_dir):
    """In this process: serve checks the flags before it starts or binds anything."""
    with pytest.raises(SystemExit, match="add --headless"):
        serve.main([tiny_dir, "-tp", "3", "--nnodes", "3", "--node-rank", "1"])


def test_a_headless_node_still_waiting_for_its_leader_exits_clean_on_sigterm(tiny_dir):
    node = headless(tiny_dir, get_open_port(), node_rank=1)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not any(
                "Worker" in " ".join(c.cmdline()) for c in psutil.Process(node.pid).children()):
            time.sleep(0.1)  # a worker process runs: it now waits in the group's rendezvous
        node.send_signal(signal.SIGTERM)
        out, _ = node.communicate(timeout=60)
        assert node.returncode == 0, out
    finally:
        if node.poll() is None:
            node.kill()
            node.communicate()
