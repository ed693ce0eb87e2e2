"""Start timeouts stretch with the load as the judge's time limits do (utils/load_scale.py):
the factor is the load per core, from 1 to 4; a child's ready wait asks for the stretched
limit, and its error names both the limit asked for and the one waited."""

import multiprocessing.connection
import os
import time

import pytest

from minivllm.judge import runner
from minivllm.utils import load_scale, mp


def never_ready(link):
    time.sleep(60)


def test_the_factor_is_the_load_per_core_from_1_to_4_as_the_judges(monkeypatch):
    monkeypatch.delenv(load_scale.SCALE_ENV, raising=False)
    monkeypatch.delenv(runner.TIME_SCALE_ENV, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    for load, want in ((0.5, 1.0), (5.0, 2.5), (20.0, 4.0)):
        monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
        assert load_scale.load_scale() == want and runner.time_scale() == want
        assert load_scale.stretched(60) == 60 * want
    monkeypatch.setenv(load_scale.SCALE_ENV, "3")
    assert load_scale.stretched(10) == 30


def test_a_childs_ready_wait_is_stretched_and_its_error_says_so(monkeypatch):
    """ready_timeout=0.2 at factor 3: connection.wait is asked for 0.6 s (recorded, not timed),
    and the ReadyTimeoutError gives both numbers."""
    monkeypatch.setenv(load_scale.SCALE_ENV, "3")
    asked, real = [], multiprocessing.connection.wait

    def wait(objects, timeout=None):
        asked.append(timeout)
        return real(objects, timeout)
    monkeypatch.setattr(multiprocessing.connection, "wait", wait)
    with pytest.raises(mp.ReadyTimeoutError,
                       match=r"slowpoke \(pid \d+\) did not report ready within 0.2 s "
                             r"\(stretched to 0.6 s: load [\d.]+ on \d+ cores\)"):
        mp.launch(never_ready, "slowpoke", ready_timeout=0.2)
    assert asked[0] == pytest.approx(0.6)
    assert not mp._LIVE
