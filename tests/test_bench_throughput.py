"""`minivllm bench throughput`: the record's structure and its headline ratios, never timings;
the limits' time boxes, counted in calls on a clock the test drives; the best bandwidth kept
between runs."""

import json
from types import SimpleNamespace

import pytest
import torch

from minivllm.bench import limits, throughput
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
    times = limits.time_boxed(lambda: calls.append(1), 10.0, StepClock())
    # the budget ends at 11; each call reads the clock twice, so calls end at 3, 5, 7, 9, 11
    assert len(calls) == len(times) == 5 and times == [1.0] * 5
    calls.clear()
    limits.time_boxed(lambda: calls.append(1), 0.0, StepClock())
    assert len(calls) == limits.MIN_CALLS  # a call is never cut short, and a limit needs two


def test_the_limits_take_a_time_budget():
    bandwidth = limits.measure_bandwidth(10.0, StepClock())
    assert bandwidth.calls == 5 and bandwidth.size == limits.BANDWIDTH_BYTES
    # a call that takes more than an eighth of the budget stops the matmul growing at 256
    small = limits.measure_matmul(torch.float32, 4.0, StepClock())
    kernels = 1 + (limits.onednn_pack(torch.eye(4)) is not None)
    assert small.size == 256 and small.calls == kernels * limits.MIN_CALLS
    # a budget 8x past every call lets it grow to the largest size, then spend what is left
    big = limits.measure_matmul(torch.float32, 100.0, StepClock())
    assert big.size == limits.MATMUL_SIZES[-1] and big.calls > kernels * limits.MIN_CALLS
    assert big.calls <= 100 // 2  # two clock reads a call: the budget bounds the calls


def test_the_best_bandwidth_is_kept_per_machine_between_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIVLLM_CACHE_DIR", str(tmp_path))
    assert limits.record_path().parent == tmp_path
    assert limits.best_bandwidth(30e9) == 30e9
    assert limits.best_bandwidth(50e9) == 50e9 and limits.best_bandwidth(40e9) == 50e9
    assert json.loads(limits.record_path().read_text()) == {limits.machine_key(): 50e9}
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)  # another thread count: another limit
    try:
        assert limits.best_bandwidth(20e9) == 20e9
    finally:
        torch.set_num_threads(threads)
    assert limits.best_bandwidth(0.0) == 50e9
    assert [p.name for p in tmp_path.iterdir()] == ["bandwidth.json"]  # no temporary left
    limits.record_path().write_text("{not json")  # a damaged record starts afresh
    assert limits.best_bandwidth(10e9) == 10e9


def test_each_rounds_limit_is_the_higher_reading_on_either_side_of_its_decode(
        tmp_path, monkeypatch):
    """Readings around three rounds of decode at 100 tok/s: a low one between rounds 1 and 2
    (another program's burst) is outvoted by its neighbours, and vs_bandwidth_limit divides by
    the best this machine has read (60 GB/s on an earlier run). The limits and the decode are
    stand-ins here: what is tested is how the row combines them."""
    monkeypatch.setenv("MINIVLLM_CACHE_DIR", str(tmp_path))
    limits.best_bandwidth(60e9)
    readings = iter([40e9, 20e9, 50e9, 45e9])
    monkeypatch.setattr(throughput, "measure_bandwidth",
                        lambda budget: limits.Limit(next(readings), 5, 1, 1.0))
    flops = iter([1e11, 3e11, 2e11, 2e11])
    monkeypatch.setattr(throughput, "measure_matmul",
                        lambda dtype, budget: limits.Limit(next(flops), 5, 256))
    monkeypatch.setattr(throughput, "engine_decode", lambda *args: 100.0)
    monkeypatch.setattr(throughput, "model_decode", lambda *args: 120.0)
    model = SimpleNamespace(weight_bytes_per_step=lambda: 10**8)
    core = SimpleNamespace(
        config=SimpleNamespace(kv_bytes_per_token=0, torch_dtype=torch.float32,
                               model_config=SimpleNamespace(num_params=10**8)),
        model_executor=SimpleNamespace(driver_worker=SimpleNamespace(
            model_runner=SimpleNamespace(model=model))))
    row = throughput.measure_row(core, "float32", 1, throughput.RowPlan([1], 4, 3), 0.0)
    assert row["bandwidth_GB_s"] == 50.0  # the rounds' limits: 40, 50, 50
    assert row["vs_run_bandwidth"] == pytest.approx(100 * 1e8 / 50e9)
    assert row["bw_spread"] == 0.1  # (50 - 40) / 2 / 50; the 20 never counts
    assert row["best_bandwidth_GB_s"] == 60.0
    assert row["vs_bandwidth_limit"] == pytest.approx(100 * 1e8 / 60e9)
    assert row["ratio_spread"] == 0.0  # decode held still; only the probe moved
    assert throughput.low_probe_notes([row]) == []  # 50 is within LOW_PROBE of 60
    low = dict(row, bandwidth_GB_s=35.0)
    assert "read 35 GB/s, this machine's best 60" in throughput.low_probe_notes([low])[0]
    assert row["matmul_GFLOP_s"] == 300.0  # 300, 300, 200
    assert row["engine_tok_s"] == 100.0 and row["model_tok_s"] == 120.0


def test_an_emulated_dtype_gets_a_brief_plan(monkeypatch):
    native = throughput.plan("bfloat16", [1, 8, 32], 24, 3)
    monkeypatch.setattr(cpu_features, "bf16_missing", lambda: "no avx512_bf16 flag")
    brief = throughput.plan("bfloat16", [1, 8, 32], 24, 3)
    assert (brief.batches, brief.rounds, brief.emulated) == ([1], 1, "no avx512_bf16 flag")
    assert brief.prompt_len < throughput.PROMPT_LEN and brief.steps <= 4
    assert throughput.plan("float32", [1, 8, 32], 24, 3).batches == [1, 8, 32]
    if cpu_features.bf16_missing() is None:
        assert native.batches == [1, 8, 32] and native.emulated is None


def test_quick_run_writes_rows_ratios_and_cpu_flags(tmp_path, capsys, monkeypatch):
    path, best = tmp_path / "t.json", tmp_path / "bandwidth.json"
    monkeypatch.setattr(limits, "record_path", lambda: best)  # not this machine's own record
    assert throughput.main(["--quick", "--dtypes", "float32", "--batches", "1,32",
                            "--json", str(path)]) == 0
    record = json.loads(path.read_text())
    assert record["bench"] == "throughput" and record["machine"]["cores"] >= 1
    assert set(record["machine"]["cpu_flags"]) == {"avx2", "avx512f", "avx512_vnni", "avx512_bf16",
                                                       "amx"}
    assert record["machine"]["isa"]["c_ops_march"]
    assert [(r["dtype"], r["batch"]) for r in record["results"]] == [("float32", 1), ("float32", 32)]
    for row in record["results"]:
        assert row["engine_tok_s"] > 0 and row["model_tok_s"] > 0
        assert row["bandwidth_GB_s"] > 0 and row["matmul_GFLOP_s"] > 0
        assert row["best_bandwidth_GB_s"] >= row["bandwidth_GB_s"]
        assert row["matmul_n"] in limits.MATMUL_SIZES and row["seconds"] > 0
    assert json.loads(best.read_text())[limits.machine_key()] == max(
        r["best_bandwidth_GB_s"] for r in record["results"]) * 1e9
    assert set(record["ratios"]) >= {"b1_vs_bandwidth_limit", "b32_vs_matmul_limit", "peak_rss_mib"}
    assert all(v > 0 for v in record["ratios"].values())
    out = capsys.readouterr().out
    assert "CPU flags: avx2" in out
    if record["machine"]["c_ops"] != "not built":  # which ops run which way, and the comparison
        assert {"b1_chosen_ops_vs_torch_ops", "b1_c_ops_vs_torch_ops"} <= set(record["ratios"])
        assert "skinny_linear" in out and "all torch" in out
