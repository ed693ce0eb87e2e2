"""bench/load: the meter sees our own CPU use and reports the rest (never asserts quiet or busy)."""

import time

from minivllm.bench.load import LoadMeter


def test_the_meter_counts_our_own_busy_loop():
    with LoadMeter() as load:
        end = time.monotonic() + 0.3
        while time.monotonic() < end:
            pass
    assert load.own_cpu_s > 0.1, "the busy loop's CPU time was not counted"
    assert load.busy_cores is None or load.busy_cores >= 0.5 * load.own_cpu_s / load.wall_s
    assert load.others_cores() is None or load.others_cores() >= 0
    text = load.describe(what="the test")
    assert text.startswith("load: ") and ("Quiet enough" in text or "BUSY: do not trust the test" in text)
