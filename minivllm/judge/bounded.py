"""For tests that call the learner's code where it may block or leak: a call in a thread
that the test can give up on, and the file descriptors this process holds."""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable


def start_call(fn: Callable[..., Any], *args: Any) -> tuple[threading.Thread, dict]:
    """Run fn(*args) in a daemon thread. `out` gets "value" or "error", then "seconds"."""
    out: dict = {}

    def body() -> None:
        start = time.monotonic()
        try:
            out["value"] = fn(*args)
        except BaseException as e:  # noqa: BLE001 - the test shows it to the learner
            out["error"] = e
        out["seconds"] = time.monotonic() - start
    t = threading.Thread(target=body, daemon=True)
    t.start()
    return t, out


def call_bounded(fn: Callable[..., Any], *args: Any, limit: float) -> tuple[threading.Thread, dict]:
    """start_call, then wait at most `limit` s: the thread is still alive if the call hangs."""
    t, out = start_call(fn, *args)
    t.join(limit)
    return t, out


def open_fds() -> set[str]:
    """This process's open file descriptors, each as 'fd -> what it points to'."""
    fds = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds.add(f"{fd} -> {os.readlink(f'/proc/self/fd/{fd}')}")
        except FileNotFoundError:  # the listing's own fd, closed by now
            pass
    return fds
