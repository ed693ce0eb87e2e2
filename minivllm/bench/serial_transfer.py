"""A large tensor through ZMQ PUSH/PULL into another process: out of band vs pickled.

The receiver (a spawned process) PULLs each message, decodes it, touches every page of the
result (sums one byte per 4 KiB page, so a lazy view cannot cheat), and acknowledges on a
second PUSH/PULL pair. The sender times encode + send + ack: one whole delivery.
"""

from __future__ import annotations

import multiprocessing as mp
import pickle
import time

import numpy as np
import zmq

from minivllm.serial import MsgpackDecoder, MsgpackEncoder
from minivllm.utils.zmq import IpcDir, close_all, make_zmq_socket

PAGE = 4096
READY_TIMEOUT_MS = 60_000  # spawn + import torch on a loaded 2-core machine
ACK_TIMEOUT_MS = 30_000


def _touch(arr: np.ndarray) -> int:
    return int(arr.reshape(-1).view(np.uint8)[::PAGE].sum())


def receiver(data_addr: str, ack_addr: str, mode: str, count: int) -> None:
    """Child process: receive `count` tensors in `mode` ('oob' or 'pickle'), ack each."""
    import torch  # noqa: F401  (the decoder rebuilds tensors)

    ctx = zmq.Context()
    pull = make_zmq_socket(ctx, data_addr, zmq.PULL, bind=False, linger=0)
    ack = make_zmq_socket(ctx, ack_addr, zmq.PUSH, bind=False, linger=1000)
    decoder = MsgpackDecoder()
    try:
        ack.send(b"ready")
        for _ in range(count):
            if not pull.poll(ACK_TIMEOUT_MS):
                return
            if mode == "oob":
                tensor = decoder.decode(pull.recv_multipart(copy=False))
            else:
                tensor = pickle.loads(pull.recv(copy=False).buffer)
            ack.send(_touch(tensor.numpy()).to_bytes(8, "little"))
    finally:
        close_all(pull, ack, linger=1000)
        ctx.term()


def transfer_times(tensor, mode: str, count: int) -> list[float]:
    """Seconds per delivery of `tensor` to a child process, `count` times."""
    ctx = zmq.Context()
    ipc = IpcDir()
    push = pull_ack = proc = None
    try:
        push = make_zmq_socket(ctx, ipc.path("data"), zmq.PUSH, bind=True, linger=0)
        pull_ack = make_zmq_socket(ctx, ipc.path("ack"), zmq.PULL, bind=True, linger=0)
        child = mp.get_context("spawn").Process(
            target=receiver, args=(ipc.path("data"), ipc.path("ack"), mode, count), daemon=True)
        child.start()
        proc = child
        if not pull_ack.poll(READY_TIMEOUT_MS):
            raise TimeoutError("the receiver process did not start within 60 s")
        pull_ack.recv()
        encoder, times = MsgpackEncoder(), []
        for _ in range(count):
            start = time.perf_counter()
            if mode == "oob":
                push.send_multipart(encoder.encode(tensor), copy=False)
            else:
                push.send(pickle.dumps(tensor, protocol=pickle.HIGHEST_PROTOCOL), copy=False)
            if not pull_ack.poll(ACK_TIMEOUT_MS):
                raise TimeoutError(f"no ack from the receiver within {ACK_TIMEOUT_MS} ms")
            pull_ack.recv()
            times.append(time.perf_counter() - start)
        return times
    finally:
        close_all(push, pull_ack)
        if proc is not None:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join()
        ctx.term()
        ipc.close()


def memcpy_times(nbytes: int, count: int) -> list[float]:
    """Seconds per np.copyto of nbytes into an already-faulted buffer: the copy limit."""
    src = np.ones(nbytes, np.uint8)
    dst = np.zeros(nbytes, np.uint8)
    times = []
    for _ in range(count):
        start = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - start)
    return times
