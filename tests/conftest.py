"""Shared fixtures. `no_leaks` runs around every test: a test that leaves a child process,
a /dev/shm segment or an ipc socket file behind fails, and the leftovers are removed."""

import os

import pytest

from minivllm.utils.leaks import Snapshot

os.environ.setdefault("MINIVLLM_QUICK", "1")


@pytest.fixture(autouse=True)
def no_leaks():
    before = Snapshot()
    yield
    leaks = before.leaks()
    if leaks:
        pytest.fail("the test left resources behind:\n" + leaks.describe(), pytrace=False)
