"""Shared fixtures. `no_leaks` runs around every test: a test that leaves a child process,
a /dev/shm segment or an ipc socket file behind fails, and the leftovers are removed."""

import multiprocessing.resource_tracker
import os

import pytest

from minivllm.utils.leaks import Snapshot

os.environ.setdefault("MINIVLLM_QUICK", "1")
# Python's resource tracker is started lazily by the first spawn or SharedMemory and then lives
# as long as pytest; start it now so that it is part of every test's "before".
multiprocessing.resource_tracker.ensure_running()


@pytest.fixture(autouse=True)
def no_leaks():
    before = Snapshot()
    yield
    leaks = before.leaks()
    if leaks:
        pytest.fail("the test left resources behind:\n" + leaks.describe(), pytrace=False)
