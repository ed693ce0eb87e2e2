"""The steadiness reports of `bench throughput` and `bench serial` (issue 26, item 6): the spread,
page faults and huge pages they read, and the note that names the side that moved."""

import numpy as np
import pytest
import torch

from minivllm.bench import serial, throughput
from minivllm.bench.common import huge_page_share, page_faults, spread


def test_spread_is_half_the_range_over_the_median():
    assert spread([0.9, 1.0, 1.1]) == pytest.approx(0.1)
    assert spread([2.0, 2.0]) == 0.0


def test_page_faults_count_first_touch():
    before = page_faults()
    buf = np.empty(64 * 2**20, np.uint8)  # an mmap, not yet touched: no faults so far
    buf[::4096] = 1
    # 16,384 pages of 4 KiB, fewer where the kernel gave 2 MiB pages
    assert page_faults() - before >= 32


def test_huge_page_share_reads_smaps():
    share = huge_page_share(torch.ones(8 * 2**20).data_ptr())
    assert share is None or 0.0 <= share <= 1.0
    whole = huge_page_share()
    assert whole is None or 0.0 <= whole <= 1.0


def row(ratio_spread, bw_spread, tok_s_spread, rounds=5):
    return {"dtype": "float32", "batch": 1, "rounds": rounds, "ratio_spread": ratio_spread,
            "bw_spread": bw_spread, "tok_s_spread": tok_s_spread, "faults_per_token": 3.0,
            "probe_huge": 1.0, "process_huge": 0.5}


def test_throughput_note_names_the_side_that_moved():
    assert "steady within +-10%" in throughput.steadiness_note([row(0.05, 0.3, 0.3)])
    assert "decode moved most" in throughput.steadiness_note([row(0.2, 0.05, 0.18)])
    moved = throughput.steadiness_note([row(0.2, 0.25, 0.02)])
    assert "the bandwidth probe moved most" in moved and "3 page faults a token" in moved
    assert "one round" in throughput.steadiness_note([row(0.0, 0.0, 0.0, rounds=1)])


def test_serial_reports_the_median_of_per_round_ratios_and_calls_out_a_wide_spread():
    rows = [{"case": f"tensor/{c}", "seconds": 1.0} for c in
            ("memcpy", "socketpair", "zmq_oob", "zmq_oob_fresh", "zmq_oob_into", "shm_arena",
             "zmq_pickle")]
    rows += [{"case": f"batch/{c}", "total_us": 1.0} for c in ("pickle_dicts", "flat_arrays",
                                                               "msgpack_dicts")]
    per_round = {"oob_tensor_vs_socket_ceiling": [0.5, 0.6, 0.7],
                 "shm_tensor_vs_memcpy": [1.0, 1.0, 1.02]}
    ratios = serial.ratios_of(rows, per_round)
    assert ratios["oob_tensor_vs_socket_ceiling"] == 0.6
    assert ratios["oob_tensor_vs_socket_ceiling_spread"] == pytest.approx(1 / 6)
    note = serial.steadiness_note(ratios, 3)
    assert "NOT steady" in note and "oob_tensor_vs_socket_ceiling +-17%" in note
    assert "shm_tensor" not in note
    assert "one round" in serial.steadiness_note(serial.ratios_of(rows), 1)
