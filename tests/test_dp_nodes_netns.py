"""Data-parallel engine cores across two network namespace hosts (utils/netns_cluster.py):
host 0 runs `minivllm serve -dp 2 --data-parallel-size-local 1` (the API server and DP rank 0),
host 1 runs `minivllm serve --headless --data-parallel-start-rank 1` (rank 1) and the clients.
Rank 1's HELLO, its requests and its outputs cross the veths and the bridge as TCP.

Remote death: the API server's ROUTER hears rank 1's connection drop (PeerWatch on its
monitor). A kill -9 closes the connection at once (the kernel's FIN): milliseconds; a silent
host or cut link would take the ZMTP heartbeat's HEARTBEAT_TIMEOUT_MS (3 s) plus up to one
interval (1 s). The test prints the delay it measured; DEAD_WITHIN_S only tells slow from hung.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from minivllm.utils import netns_cluster
from minivllm.utils.netns_cluster import NetnsCluster

pytestmark = pytest.mark.skipif(netns_cluster.unavailable() is not None,
                                reason=str(netns_cluster.unavailable()))
HERE = os.path.dirname(__file__)
RPC_PORT, HTTP_PORT = 29550, 8000  # each cluster has its own network: nobody else holds them
STREAMS = 64
DEAD_WITHIN_S = 60.0  # a hang check; the measured delay is printed
RUN_TIMEOUT_S = 240.0


def serve(c: NetnsCluster, host: int, model: str, *flags: str) -> subprocess.Popen:
    dp = ["-dp", "2", "--data-parallel-size-local", "1", "--data-parallel-address",
          c.addresses[0], "--data-parallel-rpc-port", str(RPC_PORT), "--num-threads", "1"]
    return c.popen(host, [sys.executable, "-m", "minivllm.cli", "serve", model, *dp, *flags],
                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def client(c: NetnsCluster, *argv: str) -> subprocess.Popen:
    """A client process on host 1 (the headless node's host), reaching host 0 over the bridge."""
    return c.popen(1, [sys.executable, *argv], stdout=subprocess.PIPE, text=True)


def last_json(out: str) -> dict:
    return json.loads([line for line in out.splitlines() if line.startswith("{")][-1])


def test_dp2_with_rank_1_on_another_host_serves_64_streams_and_a_kill_9_gives_503(tiny_dir):
    with NetnsCluster(2) as c:
        url = f"http://{c.addresses[0]}:{HTTP_PORT}"
        node = serve(c, 1, tiny_dir, "--headless", "--data-parallel-start-rank", "1")
        server = serve(c, 0, tiny_dir, "--host", c.addresses[0], "--port", str(HTTP_PORT),
                       "--api-server-count", "1")
        streams = client(c, os.path.join(HERE, "dp_nodes_driver.py"),
                         json.dumps({"url": url, "model": tiny_dir, "n": STREAMS}))
        report = last_json(streams.communicate(timeout=RUN_TIMEOUT_S)[0])
        assert report == {"finished": STREAMS, "reasons": ["length"], "error": None}, report

        probe = client(c, os.path.join(HERE, "multinode_driver.py"), "probe",
                       json.dumps({"url": url}))
        assert probe.stdout.readline().strip() == "streaming"
        (engine,) = [p for p in psutil.Process(node.pid).children()
                     if "EngineCore_1" in p.name() + " ".join(p.cmdline())]
        engine.send_signal(signal.SIGKILL)
        killed = time.time()
        try:
            health = last_json(probe.communicate(timeout=DEAD_WITHIN_S)[0])
        except subprocess.TimeoutExpired:
            pytest.fail(f"/health did not turn 503 within {DEAD_WITHIN_S:g} s of the kill")
        out = server.communicate(timeout=RUN_TIMEOUT_S)[0]
        node_out = node.communicate(timeout=RUN_TIMEOUT_S)[0]
        print(f"remote engine kill -9 -> /health {health['statuses']} in "
              f"{(health['at'] - killed) * 1000:.0f} ms")
        assert "503" in health["statuses"], (health, out[-3000:])
        assert '"error"' in health["last_events"][0] and health["last_events"][-1] == "[DONE]"
        assert server.returncode != 0 and "closed or fell silent" in out, out[-3000:]
        assert node.returncode == 1, node_out  # its engine died: the node says so
        for i in range(2):
            assert c.leftovers(i) == [], f"host {i} kept {c.leftovers(i)}"
