"""Exercise 411, reference answer: collective_rpc over per-worker reply queues, with an output
rank, one overall deadline, and a monitor that fails pending calls when a worker dies.

vLLM's MultiprocExecutor broadcasts (method, args, kwargs, output_rank) to every worker and
reads one response queue per worker, or only the output rank's
(vllm/v1/executor/multiproc_executor.py:447); the deadline is one for the whole call (:466,
:502); a thread waits on the workers' process sentinels and marks the executor failed when
one dies (:364). Here every call carries an id, so a late reply to a call that timed out is
recognised and dropped instead of answering the next call.
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


class Worker:  # pragma: no mutate block
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
    worker = Worker(rank)
    while (request := requests.get()) is not None:
        call_id, method, args, output_rank = request
        try:
            status, result = "ok", getattr(worker, method)(*args)
        except Exception as e:  # the worker survives a failed call and reports it
            status, result = "error", f"{type(e).__name__}: {e}"
        if output_rank is None or output_rank == rank:
            replies.put((call_id, rank, status, result))


class Executor:
    def __init__(self, n_workers: int):
        ctx = mp.get_context("spawn")
        self.requests = [ctx.Queue() for _ in range(n_workers)]
        self.replies = [ctx.Queue() for _ in range(n_workers)]
        self.procs = [ctx.Process(target=worker_main, args=(r, self.requests[r], self.replies[r]),
                                  name=f"worker-{r}", daemon=True) for r in range(n_workers)]
        for p in self.procs:
            p.start()
        self.failed: str | None = None  # why the executor cannot be used any more
        self.shutting_down = False
        self._ids = itertools.count()
        self._wake_r, self._wake_w = mp.Pipe(duplex=False)
        self.monitor = threading.Thread(target=self._monitor, name="worker-monitor", daemon=True)
        self.monitor.start()

    def _monitor(self) -> None:
        """Wait on every worker's sentinel (and the shutdown pipe); fail the executor at a death."""
        sentinels = {p.sentinel: r for r, p in enumerate(self.procs)}
        ready = mp.connection.wait(list(sentinels) + [self._wake_r])
        if self.shutting_down:
            return
        rank = next(sentinels[s] for s in ready if s in sentinels)
        self.procs[rank].join()
        # Pending calls see this within POLL_S. Writing a wake-up message on the reply queues
        # instead could hang: a worker killed while its queue feeder held the queue's write
        # lock leaves that lock taken for ever.
        self.failed = f"worker {rank} died with exit code {self.procs[rank].exitcode}"

    def collective_rpc(self, method: str, args: tuple = (), timeout: float | None = None,
                       output_rank: int | None = None) -> Any:
        """Run method on every worker; a list of results in rank order, or the output rank's."""
        if self.failed or self.shutting_down:
            raise RuntimeError(f"the executor cannot run {method!r}: "
                               f"{self.failed or 'it was shut down'}")
        deadline = None if timeout is None else time.monotonic() + timeout
        call_id = next(self._ids)
        for q in self.requests:
            q.put((call_id, method, args, output_rank))
        ranks = range(len(self.procs)) if output_rank is None else [output_rank]
        results = [self._reply(rank, call_id, method, deadline, timeout) for rank in ranks]
        return results if output_rank is None else results[0]

    def _reply(self, rank: int, call_id: int, method: str, deadline, timeout) -> Any:
        while True:
            wait = POLL_S if deadline is None else min(POLL_S, deadline - time.monotonic())
            try:
                reply_id, _, status, result = self.replies[rank].get(timeout=max(0.0, wait))
            except queue.Empty:
                if self.failed:
                    raise RuntimeError(f"{method!r} failed: {self.failed}") from None
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(f"worker {rank} did not answer {method!r} within "
                                       f"{timeout:g} s") from None
                continue
            if reply_id != call_id:
                continue  # a late reply to an earlier call that timed out
            if status != "ok":
                raise RuntimeError(f"worker {rank} failed in {method!r}: {result}")
            return result

    def shutdown(self) -> None:
        """Stop the monitor and the workers (terminate those that do not exit; kill those that
        ignore SIGTERM)."""
        if self.shutting_down:
            return
        self.shutting_down = True
        self._wake_w.send(b"")
        self.monitor.join()
        for q in self.requests:
            q.put(None)
        for p in self.procs:
            p.join(JOIN_S)
            if p.is_alive():
                p.terminate()
                p.join(JOIN_S)
            if p.is_alive():  # it ignores SIGTERM
                p.kill()
                p.join()
        for q in self.requests + self.replies:
            q.close()
            q.join_thread()
        self._wake_r.close()
        self._wake_w.close()
