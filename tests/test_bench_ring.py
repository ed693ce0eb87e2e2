"""`minivllm bench ring --quick --json`: the JSON has the structure every benchmark writes (no timings)."""

import json

from minivllm.bench import ring
from minivllm.cli import bench_names


def test_bench_ring_writes_rows_and_ratios(tmp_path, monkeypatch):
    monkeypatch.setattr(ring, "SWEEP_SIZES", [1024, 128 * 1024])  # one size fits, one overflows
    out = tmp_path / "ring.json"
    assert ring.main(["--quick", "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["bench"] == "ring" and record["machine"]["cores"] >= 1
    assert set(record["ratios"]) == {"mq_vs_raw_ring_msgs_per_s", "mq_vs_pubsub_msgs_per_s",
                                     "mq_vs_pubsub_p50_latency"}
    assert all(v > 0 for v in record["ratios"].values())
    rows = record["results"]
    headline = [r for r in rows if r["part"] == "headline"]
    assert {(r["transport"], r["paced"]) for r in headline} == {
        (t, p) for t in ("mq", "raw", "pubsub") for p in (False, True)}
    sweep = [r for r in rows if r["part"] == "sweep"]
    assert {(r["transport"], r["size"]) for r in sweep} == {  # the bare ring cannot overflow
        (t, s) for t in ("mq", "raw", "pubsub") for s in (1024, 128 * 1024)} - {("raw", 128 * 1024)}
    assert 128 * 1024 > ring.MAX_CHUNK_BYTES  # the sweep reaches into overflow
    for r in rows:
        assert r["msgs_per_s"] > 0 and r["p99_us"] >= r["p50_us"] > 0 and r["cpu_s"] >= 0


def test_bench_ring_is_a_cli_benchmark():
    assert "ring" in bench_names()
