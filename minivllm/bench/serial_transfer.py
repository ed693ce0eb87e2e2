"""A large tensor through ZMQ PUSH/PULL into another process: out of band vs pickled.

The receiver (a spawned process) PULLs each message, decodes it, touches every page of the
result (sums one byte per 4 KiB page, so a lazy view cannot cheat), and acknowledges on a
second PUSH/PULL pair. The sender times encode + send + ack: one whole delivery.

Two more rows explain the gap to memcpy. A socket moves the bytes twice (sender into the
kernel, kernel into the receiver), and libzmq mallocs a fresh buffer for every large message,
so each delivery also page-faults 64 MiB of new memory. "oob_into" sends the same bytes as
1 MiB frames that the receiver `recv_into`s a buffer it faulted once, reused every time;
"socketpair" is a raw AF_UNIX stream into such a buffer: the ceiling of any socket transport.
"""

from __future__ import annotations

import multiprocessing as mp
import pickle
import socket
import time

import numpy as np
import zmq

from minivllm.serial import MsgpackDecoder, MsgpackEncoder
from minivllm.utils.zmq import IpcDir, close_all, make_zmq_socket

PAGE = 4096
CHUNK = 1024**2  # oob_into frame size: small enough that glibc reuses one faulted buffer
READY_TIMEOUT_MS = 60_000  # spawn + import torch on a loaded 2-core machine
ACK_TIMEOUT_MS = 30_000


def _touch(arr: np.ndarray) -> int:
    return int(arr.reshape(-1).view(np.uint8)[::PAGE].sum())


def receiver(data_addr: str, ack_addr: str, mode: str, count: int, nbytes: int) -> None:
    """Child process: receive `count` tensors of nbytes in `mode` (oob, oob_into, pickle)."""
    import torch  # the decoder rebuilds tensors

    ctx = zmq.Context()
    pull = make_zmq_socket(ctx, data_addr, zmq.PULL, bind=False, linger=0)
    ack = make_zmq_socket(ctx, ack_addr, zmq.PUSH, bind=False, linger=1000)
    decoder = MsgpackDecoder()
    buf = np.ones(nbytes, np.uint8) if mode == "oob_into" else None  # every page faulted now
    try:
        ack.send(b"ready")
        for _ in range(count):
            if not pull.poll(ACK_TIMEOUT_MS):
                return
            if mode == "oob":
                tensor = decoder.decode(pull.recv_multipart(copy=False))
            elif mode == "oob_into":
                tensor = torch.from_numpy(_recv_into(pull, decoder, buf))
            else:
                tensor = pickle.loads(pull.recv(copy=False).buffer)
            ack.send(_touch(tensor.numpy()).to_bytes(8, "little"))
    finally:
        close_all(pull, ack, linger=1000)
        ctx.term()


def _chunked(frames: list) -> list:
    """[body, CHUNK-sized slices of the one out-of-band buffer]: still zero copy."""
    body, raw = frames
    return [body] + [raw[i:i + CHUNK] for i in range(0, raw.nbytes, CHUNK)]


def _recv_into(pull: zmq.Socket, decoder: MsgpackDecoder, buf: np.ndarray) -> np.ndarray:
    """Receive [body, chunks...] into `buf` (faulted once, reused), then decode a view of it."""
    body, got = pull.recv(), 0
    while pull.getsockopt(zmq.RCVMORE):
        got += pull.recv_into(buf[got:])
    return decoder.decode([body, buf[:got]])


def transfer_times(tensor, mode: str, count: int) -> list[float]:
    """Seconds per delivery of `tensor` to a child process, `count` times."""
    ctx = zmq.Context()
    ipc = IpcDir()
    push = pull_ack = proc = None
    try:
        push = make_zmq_socket(ctx, ipc.path("data"), zmq.PUSH, bind=True, linger=0)
        pull_ack = make_zmq_socket(ctx, ipc.path("ack"), zmq.PULL, bind=True, linger=0)
        child = mp.get_context("spawn").Process(
            target=receiver, args=(ipc.path("data"), ipc.path("ack"), mode, count, tensor.nbytes), daemon=True)
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
            elif mode == "oob_into":
                push.send_multipart(_chunked(encoder.encode(tensor.numpy())), copy=False)
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


def socket_receiver(path: str, nbytes: int, count: int) -> None:
    """Child process: read `count` messages of nbytes into one faulted buffer, ack each."""
    buf = memoryview(np.ones(nbytes, np.uint8))
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(path)
        for _ in range(count):
            got = 0
            while got < nbytes:
                n = sock.recv_into(buf[got:])
                if n == 0:
                    return
                got += n
            sock.sendall(_touch(np.frombuffer(buf, np.uint8)).to_bytes(8, "little"))


def socketpair_times(nbytes: int, count: int) -> list[float]:
    """Seconds per nbytes over a raw AF_UNIX stream into a reused buffer: the socket ceiling."""
    data = np.ones(nbytes, np.uint8)
    ipc = IpcDir()
    path = ipc.path("raw").removeprefix("ipc://")
    proc = None
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
            server.bind(path)
            server.listen(1)
            server.settimeout(READY_TIMEOUT_MS / 1000)
            proc = mp.get_context("spawn").Process(
                target=socket_receiver, args=(path, nbytes, count), daemon=True)
            proc.start()
            conn, _ = server.accept()
        with conn:
            conn.settimeout(ACK_TIMEOUT_MS / 1000)
            times = []
            for _ in range(count):
                start = time.perf_counter()
                conn.sendall(data.data)
                if len(conn.recv(8)) != 8:
                    raise ConnectionError("the receiver closed the socket mid-run")
                times.append(time.perf_counter() - start)
            return times
    finally:
        if proc is not None:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join()
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
