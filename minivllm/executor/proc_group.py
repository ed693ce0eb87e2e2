"""The worker processes as a group: how they start (spawn, side by side) and how they stop
(all at once: ask, wait, SIGTERM, wait, SIGKILL; vLLM's _ensure_worker_termination,
vllm/v1/executor/multiproc_executor.py (MultiprocExecutor._ensure_worker_termination)). One process's launch and its pipes are
utils/mp.py's."""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import os
import time
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.context import BaseContext

from minivllm.utils.mp import (START_METHOD_ENV, STOP_GRACE_S, TERM_GRACE_S, ProcHandle,
                               get_mp_context)

logger = logging.getLogger(__name__)


def worker_mp_context() -> BaseContext:
    """spawn, as vLLM's CPU platform forces (vllm/platforms/cpu.py (CpuPlatform.check_and_update_config)), unless the user
    chose a start method: a child forked from a process whose OpenMP pool already ran hangs in
    its first multi-threaded matmul (GNU libgomp is not fork-safe; measured here with torch:
    a forked child at 2 threads never returned, at 1 thread it did)."""
    if START_METHOD_ENV in os.environ:
        return get_mp_context()
    return multiprocessing.get_context("spawn")


def launch_all(start, n: int, context: BaseContext) -> list[ProcHandle]:
    """start(rank) for every rank, side by side (under spawn each child imports torch for
    seconds), or one by one under fork (forking while other threads run is unsafe). If one
    fails, the others are stopped and its error is raised."""
    if context.get_start_method() == "fork":
        procs: list[ProcHandle] = []
        try:
            for rank in range(n):
                procs.append(start(rank))
        except BaseException:
            for p in procs:
                p.shutdown()
            raise
        return procs
    with ThreadPoolExecutor(n, thread_name_prefix="start-worker") as pool:
        futures = [pool.submit(start, rank) for rank in range(n)]
    errors = [f.exception() for f in futures if f.exception() is not None]
    if errors:
        for f in futures:
            if f.exception() is None:
                f.result().shutdown()
        raise errors[0]
    return [f.result() for f in futures]


def wait_exit(procs: list[ProcHandle], timeout: float | None) -> list[ProcHandle]:
    """Wait until every process has exited or timeout s passed; return the live ones."""
    deadline = None if timeout is None else time.monotonic() + timeout
    alive = [p for p in procs if p.is_alive()]
    while alive and (deadline is None or time.monotonic() < deadline):
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        multiprocessing.connection.wait([p.sentinel for p in alive], left)
        alive = [p for p in alive if p.is_alive()]
    return alive


def stop_all(procs: list[ProcHandle]) -> None:
    """Ask every process to stop (b"stop" on its death pipe), wait, SIGTERM the ones left,
    wait, SIGKILL the rest; then close the death pipes."""
    for p in procs:
        p.request_stop()
    for grace, escalate in ((STOP_GRACE_S, "terminate"), (TERM_GRACE_S, "kill")):
        alive = wait_exit(procs, grace)
        if not alive:
            break
        logger.warning("workers %s still running: %s", [p.pid for p in alive], escalate)
        for p in alive:
            getattr(p.process, escalate)()
    wait_exit(procs, None)
    for p in procs:
        p.shutdown(timeout=0.0, term_timeout=0.0)  # all gone: closes the death pipes
