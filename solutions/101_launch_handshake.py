"""Reference answer of exercise 101."""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import time
from typing import Any, Callable


class WorkerStartError(RuntimeError):  # pragma: no mutate block
    """The worker failed or died before it reported ready."""


def setup_ok(value: int) -> int:  # pragma: no mutate block
    return value * 2


def setup_fails() -> None:  # pragma: no mutate block
    raise RuntimeError("boom: no model file at /models/missing.gguf")


def setup_slow(seconds: float) -> str:  # pragma: no mutate block
    time.sleep(seconds)
    return "late"


def setup_dies() -> None:  # pragma: no mutate block
    os._exit(3)


def worker_entry(conn, target: Callable, args: tuple) -> None:
    try:
        result = target(*args)
    except Exception as e:
        conn.send(("error", f"{type(e).__name__}: {e}"))
        return
    conn.send(("ready", result))


def start_worker(target: Callable, args: tuple = (), timeout: float = 10.0) -> tuple[Any, Any]:
    ctx = multiprocessing.get_context("spawn")
    reader, writer = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=worker_entry, args=(writer, target, args))
    proc.start()
    writer.close()
    try:
        ready = multiprocessing.connection.wait([reader, proc.sentinel], timeout)
        if reader in ready:
            try:
                kind, payload = reader.recv()
            except EOFError:
                kind, payload = "died", None
            if kind == "ready":
                return proc, payload
            if kind == "error":
                stop_worker(proc)
                raise WorkerStartError(f"worker pid {proc.pid} failed: {payload}")
        if ready:
            proc.join()
            raise WorkerStartError(f"worker pid {proc.pid} died with exit code {proc.exitcode}")
        stop_worker(proc)
        raise TimeoutError(f"worker pid {proc.pid} did not report ready within {timeout} s")
    finally:
        reader.close()


def stop_worker(proc, timeout: float = 2.0) -> None:
    proc.terminate()
    proc.join(timeout)
    if proc.is_alive():
        proc.kill()
        proc.join()
