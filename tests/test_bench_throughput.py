"""`minivllm bench throughput`: the record's structure and its two headline ratios, never timings."""

import json

from minivllm.bench import throughput


def test_quick_run_writes_rows_and_ratios(tmp_path):
    path = tmp_path / "t.json"
    assert throughput.main(["--quick", "--dtypes", "float32", "--batches", "1,32",
                            "--json", str(path)]) == 0
    record = json.loads(path.read_text())
    assert record["bench"] == "throughput" and record["machine"]["cores"] >= 1
    assert [(r["dtype"], r["batch"]) for r in record["results"]] == [("float32", 1), ("float32", 32)]
    for row in record["results"]:
        assert row["engine_tok_s"] > 0 and row["model_tok_s"] > 0
        assert row["bandwidth_GB_s"] > 0 and row["matmul_GFLOP_s"] > 0
    assert set(record["ratios"]) >= {"b1_vs_bandwidth_limit", "b32_vs_matmul_limit", "peak_rss_mib"}
    assert all(v > 0 for v in record["ratios"].values())
