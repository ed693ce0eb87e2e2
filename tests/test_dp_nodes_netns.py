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

import pytest

from minivllm.utils import netns_cluster
from minivllm.utils.netns_cluster import NetnsCluster
from netns_serve import (RUN_TIMEOUT_S, api_flags, kill_and_probe, serve, streams,
                         streams_report, url)

pytestmark = pytest.mark.skipif(netns_cluster.unavailable() is not None,
                                reason=str(netns_cluster.unavailable()))
RPC_PORT = 29550  # each cluster has its own network: nobody else holds it
STREAMS = 64


def dp_flags(c: NetnsCluster) -> list[str]:
    return ["-dp", "2", "--data-parallel-size-local", "1", "--data-parallel-address",
            c.addresses[0], "--data-parallel-rpc-port", str(RPC_PORT)]


def test_dp2_with_rank_1_on_another_host_serves_64_streams_and_a_kill_9_gives_503(tiny_dir):
    with NetnsCluster(2) as c:
        node = serve(c, 1, tiny_dir, *dp_flags(c), "--headless",
                     "--data-parallel-start-rank", "1")
        server = serve(c, 0, tiny_dir, *dp_flags(c), *api_flags(c, 0),
                       "--api-server-count", "1")
        report = streams_report(streams(c, 1, url(c, 0), tiny_dir, STREAMS))
        assert report == {"finished": STREAMS, "reasons": ["length"], "error": None}, report

        health = kill_and_probe(c, url(c, 0), node.pid, "EngineCore_1", probe_host=1)
        out = server.communicate(timeout=RUN_TIMEOUT_S)[0]
        node_out = node.communicate(timeout=RUN_TIMEOUT_S)[0]
        print(f"remote engine kill -9 -> /health {health['statuses']} in "
              f"{health['after_ms']:.0f} ms")
        assert "503" in health["statuses"], (health, out[-3000:])
        assert '"error"' in health["last_events"][0] and health["last_events"][-1] == "[DONE]"
        assert server.returncode != 0 and "closed or fell silent" in out, out[-3000:]
        assert node.returncode == 1, node_out  # its engine died: the node says so
        for i in range(2):
            assert c.leftovers(i) == [], f"host {i} kept {c.leftovers(i)}"
