"""`minivllm bench overhead --quick` runs end to end on the tiny model and writes the
benchmarks' common JSON record with the issue's headline ratio (timings are reported,
never asserted)."""

import json

from tiny_model import make_tiny_model_dir

from minivllm.cli import bench_names
from minivllm.cli import main as cli_main


def test_overhead_bench_writes_its_record(tmp_path):
    model = make_tiny_model_dir(str(tmp_path / "tiny"))
    out = tmp_path / "overhead.json"
    assert "overhead" in bench_names()
    assert cli_main(["bench", "overhead", "--quick", "--model", model, "--batches", "1,8",
                     "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["bench"] == "overhead" and "loadavg_1min" in record["machine"]
    decode = [r for r in record["results"] if r["kind"] == "decode"]
    assert [r["batch"] for r in decode] == [1, 8]
    assert all(r["inproc_tok_s"] > 0 and r["multiproc_tok_s"] > 0 for r in decode)
    wire = {r["layout"] for r in record["results"] if r["kind"] == "wire"}
    assert wire == {"array per output", "flat array per step", "lists (minivllm)"}
    for key in ("multiproc_vs_inproc_b1", "multiproc_vs_inproc_b8", "wire_array_vs_lists_b8",
                "wire_flat_vs_lists_b8", "load_others_cores"):
        assert key in record["ratios"]
