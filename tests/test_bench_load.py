"""bench/load: the meter sees our own CPU use and reports the rest (never asserts quiet or busy)."""

import time

from minivllm.bench.load import LoadMeter

BURN_CPU_S = 0.2  # CPU time, not wall time: on a loaded machine the loop just takes longer


def test_the_meter_counts_our_own_busy_loop():
    with LoadMeter() as load:
        end = time.process_time() + BURN_CPU_S
        while time.process_time() < end:
            pass
    assert load.own_cpu_s >= BURN_CPU_S, "the busy loop's CPU time was not counted"
    # /proc/stat counts in ticks of 10 ms: the machine was busy at least about as long as we were
    assert load.busy_cores is None or load.busy_cores * load.wall_s >= 0.5 * load.own_cpu_s
    assert load.others_cores() is None or load.others_cores() >= 0
    text = load.describe(what="the test")
    assert text.startswith("load: ") and ("Quiet enough" in text or "BUSY: do not trust the test" in text)
