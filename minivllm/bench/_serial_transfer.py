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
paired_times() runs two of these side by side, a delivery of each in turn (the bench pairs
socketpair with oob, and memcpy with shm).

Each ack also carries the page faults the receiver took for that delivery (getrusage's
ru_minflt + ru_majflt): a receive that lands in fresh memory pays one fault per 4 KiB page, and
that, not the copy, is what moves a run's time most.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import pickle
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import zmq

from minivllm.bench.common import page_faults
from minivllm.distributed.shm_tensor_arena import ShmTensorArena
from minivllm.serial import MsgpackDecoder, MsgpackEncoder
from minivllm.utils.zmq import IpcDir, close_all, make_zmq_socket, reuse_large_receive_buffers

PAGE = 4096
CHUNK = 1024**2  # oob_into frame size: small enough that glibc reuses one faulted buffer
READY_TIMEOUT_MS = 60_000  # spawn + import torch on a loaded 2-core machine
ACK_TIMEOUT_MS = 30_000
WARMUP = 1  # untimed deliveries before the timed ones: the receiver's first touch of its memory


def _touch(arr: np.ndarray) -> int:
    return int(arr.reshape(-1).view(np.uint8)[::PAGE].sum())


def _ack(touched: int, faults_before: int) -> bytes:
    """The ack: the touched-page checksum, then the faults taken since faults_before."""
    return touched.to_bytes(8, "little") + (page_faults() - faults_before).to_bytes(8, "little")


def _faults_of(ack: bytes) -> int:
    if len(ack) != 16:
        raise ConnectionError("the receiver closed the socket mid-run")
    return int.from_bytes(ack[8:], "little")


@dataclass
class Deliveries:
    """Seconds per delivery, and the receiver's page faults for each."""
    seconds: list[float] = field(default_factory=list)
    faults: list[int] = field(default_factory=list)


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
        # libzmq's I/O thread receives the whole message before poll returns: count from the
        # last ack on, so that its faults are this delivery's
        faults = page_faults()
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
            ack.send(_ack(touched, faults))
            faults = page_faults()
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


@contextlib.contextmanager
def zmq_link(tensor, mode: str, count: int) -> Iterator[Callable[[], tuple[float, int]]]:
    """A receiver process for `count` deliveries of `tensor` in `mode`; yields deliver(), which
    sends one and returns (seconds, the receiver's page faults)."""
    ctx = zmq.Context()
    ipc = IpcDir()
    push = pull_ack = proc = arena = None
    try:
        push = make_zmq_socket(ctx, ipc.path("data"), zmq.PUSH, bind=True, linger=0)
        pull_ack = make_zmq_socket(ctx, ipc.path("ack"), zmq.PULL, bind=True, linger=0)
        if mode == "shm":  # two slots: the one in use, and room for the next
            arena = ShmTensorArena(slot_bytes=tensor.nbytes, max_slots=2)
        child = mp.get_context("spawn").Process(
            target=receiver, args=(ipc.path("data"), ipc.path("ack"), mode, count,
                                   tensor.nbytes, arena and arena.handle()), daemon=True)
        child.start()
        proc = child
        if not pull_ack.poll(READY_TIMEOUT_MS):
            raise TimeoutError("the receiver process did not start within 60 s")
        pull_ack.recv()
        encoder = MsgpackEncoder(arena=arena)

        def deliver() -> tuple[float, int]:
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
            ack = pull_ack.recv()
            return time.perf_counter() - start, _faults_of(ack)
        yield deliver
    finally:
        close_all(push, pull_ack)
        _reap(proc)
        ctx.term()
        ipc.close()
        if arena is not None:
            arena.close()


def _reap(proc) -> None:
    if proc is not None:
        proc.join(10)
        if proc.is_alive():
            proc.kill()
            proc.join()


def _timed(deliver: Callable[[], tuple[float, int]], count: int) -> Deliveries:
    """count deliveries after WARMUP untimed ones: a fresh receiver's first receive faults in
    its buffer (16,384 faults at 64 MiB), which the memcpy and socket ceilings' buffers had
    before their clocks started."""
    got = Deliveries()
    for i in range(count + WARMUP):
        seconds, faults = deliver()
        if i >= WARMUP:
            got.seconds.append(seconds)
            got.faults.append(faults)
    return got


def transfer_times(tensor, mode: str, count: int) -> Deliveries:
    """Seconds per delivery of `tensor` to a child process in `mode`, `count` times."""
    with zmq_link(tensor, mode, count + WARMUP) as deliver:
        return _timed(deliver, count)


Link = Callable[[int], contextlib.AbstractContextManager]  # count -> a deliver() context


def paired_times(first: Link, second: Link, count: int) -> tuple[Deliveries, Deliveries]:
    """Two ways of delivering, both ready at once, one delivery of each in turn (first goes
    first in even pairs, second in odd ones): a burst of another program's CPU time then lands
    on both sides of a pair, not on all the deliveries of one (reference_numbers.md, 'Steady
    ratios'). Each link is called with its number of deliveries and yields deliver()."""
    n = count + WARMUP
    with first(n) as a, second(n) as b:
        got = {a: Deliveries(), b: Deliveries()}
        for i in range(n):
            for deliver in ((a, b) if i % 2 == 0 else (b, a)):
                seconds, faults = deliver()
                if i >= WARMUP:
                    got[deliver].seconds.append(seconds)
                    got[deliver].faults.append(faults)
        return got[a], got[b]


def socket_receiver(path: str, nbytes: int, count: int) -> None:
    """Child process: read `count` messages of nbytes into one faulted buffer, ack each."""
    buf = memoryview(np.ones(nbytes, np.uint8))
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(path)
        for _ in range(count):
            got, faults = 0, page_faults()
            while got < nbytes:
                n = sock.recv_into(buf[got:])
                if n == 0:
                    return
                got += n
            sock.sendall(_ack(_touch(np.frombuffer(buf, np.uint8)), faults))


@contextlib.contextmanager
def socket_link(nbytes: int, count: int) -> Iterator[Callable[[], tuple[float, int]]]:
    """A raw AF_UNIX stream to a receiver that reads `count` messages of nbytes into a reused
    buffer: the socket ceiling. Yields deliver(), as zmq_link does."""
    data = np.ones(nbytes, np.uint8)
    ipc = IpcDir()
    path = ipc.path("raw").removeprefix("ipc://")
    proc = None
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
            server.bind(path)
            server.listen(1)
            server.settimeout(READY_TIMEOUT_MS / 1000)
            child = mp.get_context("spawn").Process(
                target=socket_receiver, args=(path, nbytes, count), daemon=True)
            child.start()
            proc = child
            conn, _ = server.accept()
        with conn:
            conn.settimeout(ACK_TIMEOUT_MS / 1000)

            def deliver() -> tuple[float, int]:
                start = time.perf_counter()
                conn.sendall(data.data)
                ack = conn.recv(16, socket.MSG_WAITALL)
                return time.perf_counter() - start, _faults_of(ack)
            yield deliver
    finally:
        _reap(proc)
        ipc.close()


def socketpair_times(nbytes: int, count: int) -> Deliveries:
    """Seconds per nbytes over a raw AF_UNIX stream into a reused buffer: the socket ceiling."""
    with socket_link(nbytes, count + WARMUP) as deliver:
        return _timed(deliver, count)


@contextlib.contextmanager
def memcpy_link(nbytes: int, count: int = 0) -> Iterator[Callable[[], tuple[float, int]]]:
    """np.copyto of nbytes into an already-faulted buffer, in this process: the copy limit.
    Yields deliver(), as zmq_link does (count is unused: there is no receiver to tell)."""
    src = np.ones(nbytes, np.uint8)
    dst = np.ones(nbytes, np.uint8)  # ones, not zeros: calloc'd zeros are faulted lazily

    def deliver() -> tuple[float, int]:
        faults, start = page_faults(), time.perf_counter()
        np.copyto(dst, src)
        return time.perf_counter() - start, page_faults() - faults
    yield deliver


def memcpy_times(nbytes: int, count: int) -> Deliveries:
    """Seconds per np.copyto of nbytes into an already-faulted buffer."""
    with memcpy_link(nbytes) as deliver:
        got = Deliveries()
        for _ in range(count):
            seconds, faults = deliver()
            got.seconds.append(seconds)
            got.faults.append(faults)
        return got
