"""A large tensor into another process: ZMQ PUSH/PULL out of band or pickled, a shared-memory
arena, and a raw socket.

The receiver (a spawned process) takes each message, decodes it, touches every page of the
result (sums one byte per 4 KiB page, so a lazy view cannot cheat), drops it and acknowledges
on a second PUSH/PULL pair. The sender times encode + send + ack: one whole delivery.

    mode        the receiver
    oob         minivllm's way: out of band, with reuse_large_receive_buffers() (utils/zmq.py)
    oob_fresh   out of band, glibc's defaults: libzmq's 64 MiB buffer is a fresh mmap on every
                receive, 16,384 page faults each time
    oob_into    1 MiB frames recv_into'd a buffer faulted once, reused every time
    shm         a ShmTensorArena: the sender copies the tensor once into a shared slot and
                sends its handle; the receiver reads the slot in place (no socket copy)
    pickle      pickle.dumps / pickle.loads of the tensor, one frame

"socketpair" is a raw AF_UNIX stream into a reused buffer: the ceiling of any socket transport
(a socket moves the bytes twice, sender into the kernel and kernel into the receiver).
"""

from __future__ import annotations

import multiprocessing as mp
import pickle
import socket
import time

import numpy as np
import zmq

from minivllm.distributed.shm_tensor_arena import ShmTensorArena
from minivllm.serial import MsgpackDecoder, MsgpackEncoder
from minivllm.utils.zmq import IpcDir, close_all, make_zmq_socket, reuse_large_receive_buffers

PAGE = 4096
CHUNK = 1024**2  # oob_into frame size: small enough that glibc reuses one faulted buffer
READY_TIMEOUT_MS = 60_000  # spawn + import torch on a loaded 2-core machine
ACK_TIMEOUT_MS = 30_000


def _touch(arr: np.ndarray) -> int:
    return int(arr.reshape(-1).view(np.uint8)[::PAGE].sum())


MODES = ("oob", "oob_fresh", "oob_into", "shm", "pickle")


def receiver(data_addr: str, ack_addr: str, mode: str, count: int, nbytes: int,
             arena_handle=None) -> None:
    """Child process: receive `count` tensors of nbytes in `mode` (see MODES)."""
    import torch  # the decoder rebuilds tensors

    if mode == "oob":
        reuse_large_receive_buffers()  # before libzmq's threads allocate anything
    ctx = zmq.Context()
    pull = make_zmq_socket(ctx, data_addr, zmq.PULL, bind=False, linger=0)
    ack = make_zmq_socket(ctx, ack_addr, zmq.PUSH, bind=False, linger=1000)
    arena = ShmTensorArena.attach(arena_handle) if mode == "shm" else None
    decoder = MsgpackDecoder(arena=arena)
    buf = np.ones(nbytes, np.uint8) if mode == "oob_into" else None  # every page faulted now
    try:
        ack.send(b"ready")
        for _ in range(count):
            if not pull.poll(ACK_TIMEOUT_MS):
                return
            if mode == "oob_into":
                tensor = torch.from_numpy(_recv_into(pull, decoder, buf))
            elif mode == "pickle":
                tensor = pickle.loads(pull.recv(copy=False).buffer)
            else:
                tensor = decoder.decode(pull.recv_multipart(copy=False))
            touched = _touch(tensor.numpy())
            del tensor  # frees the frame, or releases the arena's slot for the next one
            ack.send(touched.to_bytes(8, "little"))
    finally:
        close_all(pull, ack, linger=1000)
        ctx.term()
        if arena is not None:
            arena.close()


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
    push = pull_ack = proc = arena = None
    try:
        push = make_zmq_socket(ctx, ipc.path("data"), zmq.PUSH, bind=True, linger=0)
        pull_ack = make_zmq_socket(ctx, ipc.path("ack"), zmq.PULL, bind=True, linger=0)
        if mode == "shm":  # two slots: the one in use, and room for the next
            arena = ShmTensorArena(slot_bytes=tensor.nbytes, max_slots=2)
        child = mp.get_context("spawn").Process(
            target=receiver, args=(ipc.path("data"), ipc.path("ack"), mode, count, tensor.nbytes,
                                   arena and arena.handle()), daemon=True)
        child.start()
        proc = child
        if not pull_ack.poll(READY_TIMEOUT_MS):
            raise TimeoutError("the receiver process did not start within 60 s")
        pull_ack.recv()
        encoder, times = MsgpackEncoder(arena=arena), []
        for _ in range(count):
            start = time.perf_counter()
            if mode == "oob_into":
                push.send_multipart(_chunked(encoder.encode(tensor.numpy())), copy=False)
            elif mode == "pickle":
                push.send(pickle.dumps(tensor, protocol=pickle.HIGHEST_PROTOCOL), copy=False)
            else:
                frames = encoder.encode(tensor)
                if mode == "shm" and len(frames) != 1:
                    raise RuntimeError("the arena had no free slot: the receiver holds both")
                push.send_multipart(frames, copy=False)
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
        if arena is not None:
            arena.close()


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
