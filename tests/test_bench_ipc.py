"""`minivllm bench ipc`: structure and behaviour (never timings), with real processes."""

import json
import multiprocessing.resource_tracker

import numpy as np

from minivllm.bench import ipc
from minivllm.bench._ipc_transports import Transport, grow_pipe

multiprocessing.resource_tracker.ensure_running()  # shared memory starts it; not a leak


def test_each_transport_delivers_the_bytes_and_echoes():
    for kind in ipc.TRANSPORTS:
        with Transport(kind) as t:
            dst = np.zeros(4096, np.uint8)
            assert t.bandwidth(memoryview(dst), 5) > 0
            if kind != "shm":  # shm reads in place, so dst stays untouched
                assert (dst == 7).all(), f"{kind} delivered wrong bytes"
            times = t.round_trips(64, 20)
            assert len(times) == 20 and min(times) > 0


def test_grown_pipe_is_larger_than_the_default():
    import os
    r, w = os.pipe()
    try:
        assert grow_pipe(w) > 65536
    finally:
        os.close(r)
        os.close(w)


def test_quick_run_writes_every_transport_and_ratio(tmp_path, capsys):
    out, png = tmp_path / "ipc.json", tmp_path / "ipc.png"
    assert ipc.main(["--quick", "--json", str(out), "--plot", str(png)]) == 0
    record = json.loads(out.read_text())
    assert record["bench"] == "ipc" and record["machine"]["cores"] >= 1
    rows = record["results"]
    for name in ["memcpy"] + ipc.TRANSPORTS:
        bw = [r for r in rows if r["transport"] == name and r["metric"] == "bandwidth"]
        assert sorted(r["size"] for r in bw) == ipc.QUICK_SIZES, name
        assert all(r["gbps"] > 0 and r["gbps_min"] <= r["gbps"] <= r["gbps_max"] for r in bw)
        lat = [r for r in rows if r["transport"] == name and r["metric"] == "latency"]
        assert len(lat) == 1 and 0 < lat[0]["p50_us"] <= lat[0]["p99_us"], name
    for key in ("shm_vs_memcpy", "unix_vs_memcpy", "pipe_vs_memcpy", "tcp_vs_memcpy"):
        assert record["ratios"][key] > 0, key
    assert png.stat().st_size > 10_000
    printed = capsys.readouterr().out
    assert "x memcpy" in printed and "shm_copy" in printed


def test_ratios_are_relative_to_memcpy_at_one_size():
    rows = [{"metric": "bandwidth", "transport": t, "size": ipc.RATIO_SIZE, "gbps": g}
            for t, g in [("memcpy", 10.0), ("shm", 8.0), ("pipe", 2.0)]]
    assert ipc.ratios_of(rows) == {"pipe_vs_memcpy": 0.2, "shm_vs_memcpy": 0.8}
