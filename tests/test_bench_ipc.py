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


def _stream_through_ring(slots: int, count: int, copy_out: bool) -> None:
    """Send `count` messages through a ring of `slots` slots between two threads, neither side
    spinning: every wait sleeps on its pipe, and a lost wakeup raises TimeoutError."""
    import os
    import threading
    from minivllm.bench import _ipc_shm_ring as ipr, _ipc_transports as ipt

    segment = memoryview(bytearray(ipr.RING_BYTES + ipr.CTRL_BYTES))
    (bell_r, bell_w), (ack_r, ack_w) = os.pipe(), os.pipe()
    sender = ipr.ShmRing(segment, ipt.FdStream(0, bell_w), ipt.FdStream(ack_r, 0))
    receiver = ipr.ShmRing(segment, ipt.FdStream(bell_r, 0), ipt.FdStream(0, ack_w))
    sender.spin_s = receiver.spin_s = 0.0
    size = ipr.RING_BYTES // slots
    assert ipr.slots_for(size) == slots
    src, dst = memoryview(np.full(size, 7, np.uint8)), np.zeros(size, np.uint8)
    errors = []

    def send():
        try:
            sender.send_stream(src, count)
        except BaseException as e:  # noqa: BLE001  (reported below)
            errors.append(e)
    thread = threading.Thread(target=send)
    thread.start()
    try:
        receiver.recv_stream(memoryview(dst), count, copy_out=copy_out)
    finally:
        thread.join(30)
        for fd in (bell_r, bell_w, ack_r, ack_w):
            os.close(fd)
    assert not errors, errors
    if copy_out:
        assert (dst == 7).all()
    assert sender.counts[ipr.HEAD // 8] == receiver.counts[ipr.TAIL // 8] == count


def test_shm_ring_hands_over_every_message_through_its_pipes():
    # 2 slots, copied out: both sides ask for one message or slot at a time
    _stream_through_ring(slots=2, count=6, copy_out=True)
    # 8 slots, read in place: the receiver asks for batches of 2, the last one cut at the end
    _stream_through_ring(slots=8, count=21, copy_out=False)


def test_the_headline_ratio_is_the_median_of_its_rounds():
    rows = [{"metric": "bandwidth", "transport": "memcpy", "size": ipc.RATIO_SIZE, "gbps": 10.0},
            {"metric": "bandwidth", "transport": "shm", "size": ipc.RATIO_SIZE, "gbps": 5.0,
             "vs_memcpy_rounds": [0.8, 1.0, 0.9]}]
    ratios = ipc.ratios_of(rows)
    assert ratios["shm_vs_memcpy"] == 0.9  # the rounds' median, not 5 / 10
    assert abs(ratios["shm_vs_memcpy_spread"] - 0.1 / 0.9) < 1e-12
