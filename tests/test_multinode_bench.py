"""`minivllm bench nodes`: its ring part runs on namespace hosts and reports both readers."""

import json

import pytest

from minivllm.bench import nodes
from minivllm.utils import netns_cluster


@pytest.mark.skipif(netns_cluster.unavailable() is not None,
                    reason=str(netns_cluster.unavailable()))
def test_bench_nodes_ring_part_reports_both_readers_with_and_without_delay(tmp_path):
    """A delayed host's messages cannot arrive before the delay (netem and the wire never
    deliver early): the remote reader's p50 is at least DELAY_MS; the plot is drawn."""
    out, png = tmp_path / "nodes.json", tmp_path / "nodes.png"
    assert nodes.main(["--quick", "--part", "ring", "--json", str(out), "--plot", str(png)]) == 0
    record = json.loads(out.read_text())
    rows = {(r["reader"], r["delay_ms"]): r for r in record["results"]}
    assert set(rows) == {(reader, d) for reader in ("local", "remote") for d in (0, nodes.DELAY_MS)}
    assert all(r["n"] > 0 and r["p50_us"] > 0 for r in rows.values())
    assert rows[("remote", nodes.DELAY_MS)]["delay_by"] in ("tc netem", "wire")
    assert rows[("remote", nodes.DELAY_MS)]["p50_us"] >= nodes.DELAY_MS * 1000
    assert record["ratios"]["remote_reader_vs_local_reader_p50"] > 0
    assert record["ratios"][f"remote_reader_vs_local_reader_p50_delay_{nodes.DELAY_MS:g}ms"] > 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_nodes_says_why_it_cannot_run(monkeypatch, capsys):
    monkeypatch.setattr(netns_cluster, "unavailable", lambda: "network namespaces need root")
    assert nodes.main(["--part", "ring"]) == 2
    assert "need root" in capsys.readouterr().err
