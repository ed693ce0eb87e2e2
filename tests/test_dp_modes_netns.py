"""Data parallelism over two network namespace hosts (utils/netns_cluster.py) in vLLM's three
launch modes (engine/dp_nodes.py), each through the official openai client:

- --nnodes 2 over DP=2 x TP=2: host 0 runs `serve -dp 2 -tp 2 --nnodes 2 --node-rank 0` (the
  API server, DP rank 0 and its two TP workers), host 1 `--headless --node-rank 1` (DP rank
  1, its rank from the node rank, with its own two workers). A kill -9 of a TP worker on
  host 1 turns /health into 503: its engine core sees the worker die and reports itself
  dead over tcp.
- hybrid load balancing (-dpl 2 -dpr S, no --headless): API servers on both hosts, each in
  front of its own two engines; external (-dpl 1 -dpr R: hybrid with one local engine, which
  vLLM turns into external mode for any model, while -dpe/-dpn are for MoE models only): one
  engine per API server. Both hosts serve streams; a kill -9 of an engine on host 1 takes host 1's API
  server down (503) while host 0 keeps serving: the nodes share nothing.
"""

from __future__ import annotations

import pytest

from minivllm.utils import netns_cluster
from minivllm.utils.netns_cluster import NetnsCluster
from netns_serve import api_flags, kill_and_probe, serve, streams, streams_report, url

pytestmark = pytest.mark.skipif(netns_cluster.unavailable() is not None,
                                reason=str(netns_cluster.unavailable()))
STREAMS = 64
DONE = {"finished": STREAMS, "reasons": ["length"], "error": None}


def test_nnodes_2_over_dp2_x_tp2_serves_64_streams_and_a_remote_rank_kill_9_gives_503(
        tiny_dir_tp2):
    with NetnsCluster(2) as c:
        nodes = ["-dp", "2", "-tp", "2", "--nnodes", "2", "--master-addr", c.addresses[0]]
        node = serve(c, 1, tiny_dir_tp2, *nodes, "--node-rank", "1", "--headless")
        # vLLM's default: -dp 2 API servers, each adopting its listening tcp sockets
        server = serve(c, 0, tiny_dir_tp2, *nodes, "--node-rank", "0", *api_flags(c, 0))
        report = streams_report(streams(c, 1, url(c, 0), tiny_dir_tp2, STREAMS))
        if report != DONE:  # say why: the servers' own words
            for proc in (server, node):
                proc.kill()
            pytest.fail(f"{report}\nleader: {server.communicate()[0][-3000:]}\n"
                        f"node 1: {node.communicate()[0][-3000:]}")
        health = kill_and_probe(c, url(c, 0), node.pid, "Worker_TP1", probe_host=1)
        out = server.communicate(timeout=60)[0]
        node_out = node.communicate(timeout=60)[0]
        print(f"remote TP worker kill -9 -> /health {health['statuses']} after "
              f"{health['after_ms']:.0f} ms")
        assert "503" in health["statuses"], (health, out[-3000:])
        assert '"error"' in health["last_events"][0] and health["last_events"][-1] == "[DONE]"
        assert server.returncode != 0, out[-3000:]
        assert node.returncode == 1 and "EngineCore_1" in node_out, node_out[-3000:]
        for i in range(2):
            assert c.leftovers(i) == [], f"host {i} kept {c.leftovers(i)}"


MODES = {  # host i's flags
    "hybrid": lambda c, i: ["-dp", "4", "-dpl", "2", "-dpr", str(2 * i),
                            "--api-server-count", "1"],
    "external": lambda c, i: ["-dp", "2", "-dpl", "1", "-dpr", str(i), "--nnodes", "2",
                              "--node-rank", str(i), "--master-addr", c.addresses[0]],
}


@pytest.mark.parametrize("mode", sorted(MODES))
def test_every_node_serves_its_own_engines_and_outlives_the_other(tiny_dir, mode):
    with NetnsCluster(2) as c:
        servers = [serve(c, i, tiny_dir, *MODES[mode](c, i), *api_flags(c, i)) for i in (0, 1)]
        half = STREAMS // 2
        runs = [streams(c, 1 - i, url(c, i), tiny_dir, half) for i in (0, 1)]
        reports = [streams_report(r) for r in runs]
        assert reports == [dict(DONE, finished=half)] * 2, reports
        health = kill_and_probe(c, url(c, 1), servers[1].pid, "EngineCore_", probe_host=0)
        print(f"{mode}: host 1's engine kill -9 -> its /health {health['statuses']} after "
              f"{health['after_ms']:.0f} ms")
        assert "503" in health["statuses"], health
        again = streams_report(streams(c, 1, url(c, 0), tiny_dir, 4))
        assert again == dict(DONE, finished=4), again  # host 0 did not notice
        servers[1].communicate(timeout=60)
        assert servers[1].returncode != 0
