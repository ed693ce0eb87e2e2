"""bench/load: the meter sees our own CPU use and reports the rest (never asserts quiet or busy)."""

import time

from minivllm.bench.load import LoadMeter


def test_the_meter_counts_our_own_busy_loop():
    cpu0 = time.process_time()
    with LoadMeter() as load:
        end = time.monotonic() + 0.3
        while time.monotonic() < end:
            pass
    own = time.process_time() - cpu0
    assert own > 0.1, "the busy loop did not run"
    assert load.busy_cores is None or load.busy_cores >= 0.5 * own / load.wall_s
    assert load.others_cores(own) is None or load.others_cores(own) >= 0
    text = load.describe(own, what="the test")
    assert text.startswith("load: ") and ("Quiet enough" in text or "BUSY: do not trust the test" in text)
