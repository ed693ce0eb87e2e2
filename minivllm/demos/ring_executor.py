"""MessageQueue the way the executor (chapter 08) uses it, with a stand-in for the model.

    executor (engine core)  --rpc MessageQueue (1 writer, N readers)-->  worker 0 .. N-1
    executor                <--reply MessageQueue per worker (1 reader)--  each worker

This mirrors vLLM's MultiprocExecutor in vllm/v1/executor/multiproc_executor.py (its
_init_executor creates the broadcast queue, collective_rpc enqueues each call and dequeues each
reply) and WorkerProc (its _init_message_queues attaches with create_from_handle and creates
its reply MessageQueue(1, 1)).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from multiprocessing import shared_memory

import numpy as np

from minivllm.distributed.shm_broadcast import MessageQueue

READY_TIMEOUT_S = 60.0
STEP_TIMEOUT_S = 30.0
JOIN_TIMEOUT_S = 10.0  # a worker that got "shutdown" exits at once; after that, kill it


def worker_main(rpc_handle, rank: int, conn) -> None:
    """A worker process: read every step from the broadcast queue, reply on its own queue."""
    rpc = MessageQueue.create_from_handle(rpc_handle, rank)
    reply = MessageQueue(1, 1, max_chunk_bytes=1 << 16, max_chunks=4)
    conn.send(reply.export_handle())  # the executor attaches to it as reader 0
    rpc.wait_until_ready(READY_TIMEOUT_S)
    reply.wait_until_ready(READY_TIMEOUT_S)
    try:
        while True:
            method, step = rpc.dequeue()
            if method == "shutdown":
                break
            # A stand-in for the forward pass: tensor-parallel rank `rank` owns a slice.
            ids = step["token_ids"]
            reply.enqueue({"rank": rank, "step": step["step"],
                           "partial_sum": int(ids[rank::step["world_size"]].sum())})
    finally:
        rpc.close()
        reply.close()


class DemoExecutor:
    """Starts `world_size` workers and broadcasts steps to them; collects one reply each."""

    def __init__(self, world_size: int = 2, max_chunk_bytes: int = 1 << 16, max_chunks: int = 8):
        ctx = mp.get_context("spawn")
        self.world_size = world_size
        self.rpc = MessageQueue(world_size, world_size, max_chunk_bytes, max_chunks)
        pipes = [ctx.Pipe(duplex=False) for _ in range(world_size)]
        self.procs = [ctx.Process(target=worker_main, args=(self.rpc.export_handle(), r, tx),
                                  daemon=True) for r, (_, tx) in enumerate(pipes)]
        for p in self.procs:
            p.start()
        self.replies = []
        try:
            for rank, (rx, _) in enumerate(pipes):
                self.replies.append(MessageQueue.create_from_handle(self._handle(rank, rx), 0))
        except BaseException:
            self._stop_workers()
            self.rpc.close()
            raise
        self.rpc.wait_until_ready(READY_TIMEOUT_S)
        for mq in self.replies:
            mq.wait_until_ready(READY_TIMEOUT_S)

    def _handle(self, rank: int, rx):
        """Worker rank's reply handle; fail fast if the worker dies before sending it."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not rx.poll(0.1):
            proc = self.procs[rank]
            if not proc.is_alive():
                raise RuntimeError(f"worker {rank} exited with code {proc.exitcode} before it was "
                                   "ready (see its traceback above)")
            if time.monotonic() > deadline:
                raise TimeoutError(f"worker {rank} did not send its reply handle within "
                                   f"{READY_TIMEOUT_S:g} s")
        return rx.recv()

    def _stop_workers(self) -> None:
        for p in self.procs:
            p.join(JOIN_TIMEOUT_S if p.exitcode is None else 0)
            if p.is_alive():
                p.kill()
                p.join()

    def execute(self, step: int, token_ids: np.ndarray,
                timeout: float = STEP_TIMEOUT_S) -> list[dict]:
        """One broadcast, then one reply from every worker, in rank order."""
        self.rpc.enqueue(("execute_model", {"step": step, "token_ids": token_ids,
                                            "world_size": self.world_size}), timeout=timeout)
        return [self._reply(rank, timeout) for rank in range(self.world_size)]

    def _reply(self, rank: int, timeout: float) -> dict:
        """Worker rank's reply. Its reply queue's own error says "reader 0" (the executor reads
        every reply queue as reader 0), so a timeout here names the worker and its process."""
        try:
            return self.replies[rank].dequeue(timeout=timeout)
        except TimeoutError as e:
            code = self.procs[rank].exitcode
            state = "alive" if code is None else f"dead, exit code {code}"
            raise TimeoutError(f"worker {rank} sent no reply within {timeout:g} s (its process: "
                               f"{state}); its reply queue, which the executor reads as "
                               f"reader 0, says: {e}") from None

    def close(self) -> None:
        try:
            self.rpc.enqueue(("shutdown", None), timeout=STEP_TIMEOUT_S / 10)
        except TimeoutError:
            pass  # a dead worker never frees its chunk: the join below kills the rest
        self._stop_workers()
        for p, mq in zip(self.procs, self.replies):
            if p.exitcode != 0:  # a killed worker never removed its reply ring and sockets
                _remove_leftovers(mq.export_handle())
            mq.close()
        self.rpc.close()

    def __enter__(self) -> "DemoExecutor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _remove_leftovers(handle) -> None:
    """Remove what a dead writer left: its segment (also dropping it from the resource tracker
    the workers share with us) and its ipc socket files."""
    try:
        shm = shared_memory.SharedMemory(name=handle.buffer_handle[3])
    except FileNotFoundError:
        pass
    else:
        shm.close()
        shm.unlink()
    for address in (handle.local_subscribe_addr, handle.local_notify_addr):
        try:
            os.unlink(address.removeprefix("ipc://"))
        except (FileNotFoundError, AttributeError):
            pass


def step_round_trips(executor: DemoExecutor, steps: int, n_tokens: int) -> np.ndarray:
    """Time `steps` broadcast + reply round trips, in microseconds each."""
    rng = np.random.default_rng(0)
    times = np.empty(steps)
    for i in range(steps):
        ids = rng.integers(0, 50_000, n_tokens, dtype=np.int32)
        start = time.perf_counter()
        replies = executor.execute(i, ids)
        times[i] = (time.perf_counter() - start) * 1e6
        if sum(r["partial_sum"] for r in replies) != int(ids.sum()):
            raise AssertionError(f"step {i}: the workers' partial sums do not add up")
    return times
