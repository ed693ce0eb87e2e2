"""`minivllm bench nodes`: its ring part runs on namespace hosts and reports both readers."""

import json

import pytest

from minivllm.bench import nodes
from minivllm.utils import netns_cluster


@pytest.mark.skipif(netns_cluster.unavailable() is not None,
                    reason=str(netns_cluster.unavailable()))
def test_bench_nodes_ring_part_reports_a_local_and_a_remote_reader(tmp_path):
    out = tmp_path / "nodes.json"
    assert nodes.main(["--quick", "--part", "ring", "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    readers = {r["reader"] for r in record["results"] if r["netem_ms"] == 0}
    assert readers == {"local", "remote"}
    assert all(r["n"] > 0 and r["p50_us"] > 0 for r in record["results"])
    assert record["ratios"]["remote_reader_vs_local_reader_p50"] > 0


def test_bench_nodes_says_why_it_cannot_run(monkeypatch, capsys):
    monkeypatch.setattr(netns_cluster, "unavailable", lambda: "network namespaces need root")
    assert nodes.main(["--part", "ring"]) == 2
    assert "need root" in capsys.readouterr().err
