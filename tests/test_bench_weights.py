"""`minivllm bench weights`: structure and behaviour of the record, never its timings."""

import json
import multiprocessing.resource_tracker

from minivllm.bench import weights
from minivllm.cli import bench_names

# The tracker that spawn starts lives as long as pytest: start it before the leak snapshot.
multiprocessing.resource_tracker.ensure_running()


def test_bench_weights_writes_the_record_with_the_headline_ratio(tmp_path, capsys):
    path = tmp_path / "weights.json"
    assert weights.main(["--quick", "--json", str(path)]) == 0
    record = json.loads(path.read_text())
    assert record["bench"] == "weights"
    assert {"cores", "cpu", "torch"} <= set(record["machine"])
    methods = {(r["MiB"], r["method"]) for r in record["results"]}
    sizes = {mib for mib, _ in methods}
    assert len(sizes) == len(weights.QUICK_SIZES_MIB)
    assert methods == {(s, m) for s in sizes for m in ("socket+pickle", "shm (warm)", "shm (cold)")}
    assert all(r["median_ms"] > 0 and r["runs"] == weights.QUICK_REPEATS for r in record["results"])
    assert set(record["ratios"]) == {"ipc_speedup_vs_socket", "ipc_cold_speedup_vs_socket"}
    assert all(v > 0 for v in record["ratios"].values())
    out = capsys.readouterr().out
    assert "ipc_speedup_vs_socket:" in out and "socket+pickle" in out


def test_bench_weights_is_found_by_the_cli():
    assert "weights" in bench_names()
