"""`minivllm bench throughput`: the record's structure and its headline ratios, never timings;
the limits' time boxes, counted in calls on a clock the test drives."""

import json

import torch

from minivllm.bench import throughput
from minivllm.model import cpu_features


class StepClock:
    """A clock that advances one second each time it is read: every call "takes" a second."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def test_time_boxed_stops_when_its_budget_is_spent():
    calls = []
    times = throughput.time_boxed(lambda: calls.append(1), 10.0, StepClock())
    # the budget ends at 11; each call reads the clock twice, so calls end at 3, 5, 7, 9, 11
    assert len(calls) == len(times) == 5 and times == [1.0] * 5
    calls.clear()
    throughput.time_boxed(lambda: calls.append(1), 0.0, StepClock())
    assert len(calls) == throughput.MIN_CALLS  # a call is never cut short, and a limit needs two


def test_the_limits_take_a_time_budget():
    bandwidth = throughput.measure_bandwidth(10.0, StepClock())
    assert bandwidth.calls == 5 and bandwidth.size == throughput.BANDWIDTH_BYTES
    # a call that takes more than an eighth of the budget stops the matmul growing at 256
    small = throughput.measure_matmul(torch.float32, 4.0, StepClock())
    kernels = 1 + (throughput.onednn_pack(torch.eye(4)) is not None)
    assert small.size == 256 and small.calls == kernels * throughput.MIN_CALLS
    # a budget 8x past every call lets it grow to the largest size, then spend what is left
    big = throughput.measure_matmul(torch.float32, 100.0, StepClock())
    assert big.size == throughput.MATMUL_SIZES[-1] and big.calls > kernels * throughput.MIN_CALLS
    assert big.calls <= 100 // 2  # two clock reads a call: the budget bounds the calls


def test_an_emulated_dtype_gets_a_brief_plan(monkeypatch):
    native = throughput.plan("bfloat16", [1, 8, 32], 24, 3)
    monkeypatch.setattr(cpu_features, "bf16_missing", lambda: "no avx512_bf16 flag")
    brief = throughput.plan("bfloat16", [1, 8, 32], 24, 3)
    assert (brief.batches, brief.rounds, brief.emulated) == ([1], 1, "no avx512_bf16 flag")
    assert brief.prompt_len < throughput.PROMPT_LEN and brief.steps <= 4
    assert throughput.plan("float32", [1, 8, 32], 24, 3).batches == [1, 8, 32]
    if cpu_features.bf16_missing() is None:
        assert native.batches == [1, 8, 32] and native.emulated is None


def test_quick_run_writes_rows_ratios_and_cpu_flags(tmp_path, capsys):
    path = tmp_path / "t.json"
    assert throughput.main(["--quick", "--dtypes", "float32", "--batches", "1,32",
                            "--json", str(path)]) == 0
    record = json.loads(path.read_text())
    assert record["bench"] == "throughput" and record["machine"]["cores"] >= 1
    assert set(record["machine"]["cpu_flags"]) == {"avx2", "avx512f", "avx512_bf16", "amx"}
    assert record["machine"]["isa"]["c_ops_march"]
    assert [(r["dtype"], r["batch"]) for r in record["results"]] == [("float32", 1), ("float32", 32)]
    for row in record["results"]:
        assert row["engine_tok_s"] > 0 and row["model_tok_s"] > 0
        assert row["bandwidth_GB_s"] > 0 and row["matmul_GFLOP_s"] > 0
        assert row["matmul_n"] in throughput.MATMUL_SIZES and row["seconds"] > 0
    assert set(record["ratios"]) >= {"b1_vs_bandwidth_limit", "b32_vs_matmul_limit", "peak_rss_mib"}
    assert all(v > 0 for v in record["ratios"].values())
    out = capsys.readouterr().out
    assert "CPU flags: avx2" in out
    if record["machine"]["c_ops"] != "not built":  # which ops run which way, and the comparison
        assert {"b1_chosen_ops_vs_torch_ops", "b1_c_ops_vs_torch_ops"} <= set(record["ratios"])
        assert "skinny_linear" in out and "all torch" in out
