"""Exercise 411 (see README.md): collective_rpc over per-worker reply queues, with an output
rank, one overall deadline, and a monitor that fails pending calls when a worker dies.

vLLM's MultiprocExecutor broadcasts (method, args, kwargs, output_rank) to every worker and
reads one response queue per worker, or only the output rank's
(vllm/v1/executor/multiproc_executor.py:447); the deadline is one for the whole call (:466,
:502); a thread waits on the workers' process sentinels and marks the executor failed when
one dies (:364).
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
import multiprocessing.connection
import os
import queue
import signal
import threading
import time
from typing import Any

POLL_S = 0.1  # a pending call looks at `failed` this often while it waits for a reply
JOIN_S = 1.0  # how long shutdown waits for a worker to exit, then to obey SIGTERM


class Worker:
    """What a worker process runs. The judge calls these methods by name."""

    def __init__(self, rank: int):
        self.rank = rank

    def get_rank(self) -> int:
        return self.rank

    def echo(self, value: Any) -> Any:
        return value

    def sleep(self, seconds_by_rank: list[float]) -> str:
        time.sleep(seconds_by_rank[self.rank])
        return f"slept {seconds_by_rank[self.rank]}"

    def boom(self, rank: int, others_sleep: float = 0.0) -> str:
        if self.rank == rank:
            raise ValueError(f"boom on rank {rank}")
        time.sleep(others_sleep)
        return f"no boom on rank {self.rank}"

    def stall(self, rank: int, seconds: float) -> int:
        """On `rank`: ignore SIGTERM, then sleep (a worker hung in a kernel)."""
        if self.rank == rank:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            time.sleep(seconds)
        return self.rank

    def die(self, rank: int, code: int, others_sleep: float) -> int:
        if self.rank == rank:
            if code < 0:  # killed by signal -code, as the OOM killer does
                os.kill(os.getpid(), -code)
            os._exit(code)
        time.sleep(others_sleep)
        return self.rank


def worker_main(rank: int, requests, replies) -> None:
    """A worker's loop: run each (call_id, method, args, output_rank); reply if it is ours."""
    raise NotImplementedError("TODO: until None: run getattr(Worker(rank), method)(*args); "
                              "reply (call_id, rank, 'ok' | 'error', result)")


class Executor:
    def __init__(self, n_workers: int):
        self.failed: str | None = None  # why the executor cannot be used any more
        self.procs: list[mp.Process] = []
        raise NotImplementedError("TODO: a request and a reply queue per worker; spawn the "
                                  "workers; start the monitor thread")

    def _monitor(self) -> None:
        """Wait on every worker's sentinel (and the shutdown pipe); fail the executor at a death."""
        raise NotImplementedError("TODO: multiprocessing.connection.wait(...)")

    def collective_rpc(self, method: str, args: tuple = (), timeout: float | None = None,
                       output_rank: int | None = None) -> Any:
        """Run method on every worker; a list of results in rank order, or the output rank's."""
        raise NotImplementedError("TODO: a call id; one request per worker; the replies with "
                                  "what is left of ONE deadline")

    def shutdown(self) -> None:
        """Stop the monitor and the workers (terminate those that do not exit; kill those that
        ignore SIGTERM)."""
        raise NotImplementedError("TODO: wake and join the monitor first, then None to each "
                                  "worker, join")
