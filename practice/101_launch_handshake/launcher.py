"""Exercise 101: launch a worker with spawn, a ready handshake and a timeout. Read README.md.

Replace every `raise NotImplementedError` and grade with: python judge.py 101
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import time
from typing import Any, Callable


class WorkerStartError(RuntimeError):
    """The worker failed or died before it reported ready."""


def setup_ok(value: int) -> int:
    return value * 2


def setup_fails() -> None:
    raise RuntimeError("boom: no model file at /models/missing.gguf")


def setup_slow(seconds: float) -> str:
    time.sleep(seconds)
    return "late"


def setup_dies() -> None:
    os._exit(3)


def worker_entry(conn, target: Callable, args: tuple) -> None:
    # TODO: call target(*args); send ("ready", result) or ("error", text)
    raise NotImplementedError


def start_worker(target: Callable, args: tuple = (), timeout: float = 10.0) -> tuple[Any, Any]:
    # TODO: spawn context, a pipe, wait for the message or the sentinel, with a timeout
    raise NotImplementedError


def stop_worker(proc, timeout: float = 2.0) -> None:
    # TODO: terminate, join, then kill
    raise NotImplementedError
