"""MessageQueue: one writer broadcasts objects to N readers through a shared-memory ring.

The executor's shape (vLLM's MultiprocExecutor, chapter 08): the engine core's executor
writes every step once, and each of the N workers reads it; each worker replies on its own
MessageQueue with one reader. Readers on this node read the ring (ShmRingBuffer); readers
on other nodes (n_reader - n_local_reader of them) get every message over tcp PUB/SUB.

A chunk holds one message in the format of message_chunk.py. A message whose frames do not
fit one chunk overflows: the chunk carries only an OVERFLOW byte, which keeps its place in the
order, and the frames follow on the XPUB socket that every
local reader subscribes to. vLLM: MessageQueue (enqueue, dequeue, wait_until_ready) in
vllm/distributed/device_communicators/shm_broadcast.py.
"""

from __future__ import annotations

import os
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

import zmq

from minivllm import envs
from minivllm.distributed import message_chunk
from minivllm.distributed.shm_ring import NOT_READY, ShmRingBuffer
from minivllm.distributed.spin_condition import BUSY_LOOP_S, SpinCondition, notify_socket
from minivllm.serial import DecodeError, MsgpackDecoder, MsgpackEncoder
from minivllm.utils.zmq import ipc_address, tcp_address

# A writer that finds the ring full spins this long, then sleeps with a growing pause up to
# WRITER_MAX_SLEEP_S. A full ring means the readers are behind: a sleeping writer gives them
# its core (on 2 cores that raised broadcast throughput by about a third), and a ring of a few
# chunks refills long before the pause ends.
WRITER_SPIN_S = 0.0002
WRITER_MIN_SLEEP_S = 50e-6
WRITER_MAX_SLEEP_S = 0.001
# close() waits at most this long for overflow frames still queued to live readers.
CLOSE_LINGER_MS = 1000
READY = b"READY"
# A tcp reader (a reader on another node, or the executor reading a remote worker's replies)
# asks its writer for a ZMTP PING every HEARTBEAT_IVL_MS and drops the connection after
# HEARTBEAT_TIMEOUT_MS of silence, so a vanished host (no FIN ever comes) shows up as a
# disconnect (distributed/peer_watch.py). libzmq's I/O thread answers, not Python: a busy
# peer still answers within a millisecond, so 3 s of silence means the link or host is gone.
# MINIVLLM_HEARTBEAT_INTERVAL_MS and MINIVLLM_HEARTBEAT_TIMEOUT_MS set them (envs.py).
HEARTBEAT_IVL_MS, HEARTBEAT_TIMEOUT_MS = envs.heartbeat_ms()
# Bound once: enqueue runs once per message (a global and an attribute lookup saved).
_pack_into = message_chunk.pack_into
_OVERFLOWED = message_chunk.OVERFLOWED


class QueueShutdown(RuntimeError):
    """dequeue() or enqueue() was interrupted by shutdown()."""


@dataclass
class Handle:
    """Everything a reader process needs to attach; picklable, small."""
    local_reader_ranks: list[int] = field(default_factory=list)
    buffer_handle: tuple[int, int, int, str] | None = None
    local_subscribe_addr: str | None = None
    local_notify_addr: str | None = None
    remote_subscribe_addr: str | None = None
    busy_loop_s: float = BUSY_LOOP_S


class MessageQueue:
    """Writer side: MessageQueue(...). Reader side: MessageQueue.create_from_handle(h, rank)."""

    def __init__(self, n_reader: int, n_local_reader: int, max_chunk_bytes: int = 1 << 20,
                 max_chunks: int = 10, connect_ip: str | None = None, *,
                 busy_loop_s: float = BUSY_LOOP_S, encoder: MsgpackEncoder | None = None):
        if not 0 <= n_local_reader <= n_reader or n_reader < 1:
            raise ValueError(f"need 0 <= n_local_reader <= n_reader and n_reader >= 1, got "
                             f"n_reader={n_reader}, n_local_reader={n_local_reader}")
        self._init_common(is_writer=True)
        self.n_local_reader, self.n_remote_reader = n_local_reader, n_reader - n_local_reader
        self.encoder = encoder or MsgpackEncoder()
        self._encode_into = self.encoder.encode_into  # bound once: enqueue runs per message
        handle = Handle(local_reader_ranks=list(range(n_local_reader)), busy_loop_s=busy_loop_s)
        if n_local_reader:
            self.buffer = ShmRingBuffer(n_local_reader, max_chunk_bytes, max_chunks)
            handle.buffer_handle = self.buffer.handle()
            handle.local_subscribe_addr = ipc_address("mq")
            handle.local_notify_addr = ipc_address("notify")
            self.local_socket = self._xpub(handle.local_subscribe_addr)
            self.notify_socket = notify_socket(self.context, handle.local_notify_addr)
            self._ipc_files.append(handle.local_notify_addr[len("ipc://"):])
            self._sockets += [self.local_socket, self.notify_socket]
        if self.n_remote_reader:
            self.remote_socket = self._xpub(tcp_address(connect_ip or "127.0.0.1", 0))
            handle.remote_subscribe_addr = self.remote_socket.getsockopt(zmq.LAST_ENDPOINT).decode()
            self._sockets.append(self.remote_socket)
        self.handle = handle
        self._arm_finalizer()

    @staticmethod
    def create_from_handle(handle: Handle, rank: int,
                           decoder: MsgpackDecoder | None = None) -> "MessageQueue":
        """Attach as reader `rank`: local if rank is in handle.local_reader_ranks, else remote."""
        self = MessageQueue.__new__(MessageQueue)
        self._init_common(is_writer=False)
        self.handle, self.decoder = handle, decoder or MsgpackDecoder()
        self._decode_chunk = message_chunk.decode_from(self.decoder)
        if rank in handle.local_reader_ranks:
            self.local_reader_rank = handle.local_reader_ranks.index(rank)
            self.buffer = self._read_ring = ShmRingBuffer(*handle.buffer_handle)
            self.local_socket = self._sub(handle.local_subscribe_addr)
            self.spin = SpinCondition(self.context, handle.local_notify_addr, self.buffer,
                                      handle.busy_loop_s)
            self._sockets += [self.local_socket, *self.spin.sockets()]
        else:
            self.remote_socket = self._sub(handle.remote_subscribe_addr)
            self._sockets.append(self.remote_socket)
        self._arm_finalizer()
        return self

    def _init_common(self, is_writer: bool) -> None:
        self.is_writer, self.shutting_down = is_writer, False
        self.context = zmq.Context()
        self._sockets: list[zmq.Socket] = []
        self._ipc_files: list[str] = []  # bound ipc:// endpoints: libzmq leaves the files
        self.buffer: ShmRingBuffer | None = None
        self._read_ring: ShmRingBuffer | None = None  # a local reader's ring (buffer) alone
        self.local_socket = self.remote_socket = self.notify_socket = None
        self.spin: SpinCondition | None = None
        self.local_reader_rank, self.current_idx = -1, 0
        self._overflow_pending = False  # reader: an overflow chunk was read, its frames were not
        self._body = bytearray()  # writer: the msgpack body, reused until zmq is handed it
        self._encode_into = _only_the_writer  # the writer binds its encoder here

    def _xpub(self, address: str) -> zmq.Socket:
        sock = self.context.socket(zmq.XPUB)
        sock.setsockopt(zmq.XPUB_VERBOSE, 1)  # report every subscription, not only the first
        sock.setsockopt(zmq.SNDHWM, 0)  # never drop: the ring bounds what is in flight
        sock.setsockopt(zmq.IPV6, address.startswith("tcp://["))  # VLLM_HOST_IP may be IPv6
        sock.bind(address)
        if address.startswith("ipc://"):
            self._ipc_files.append(address[len("ipc://"):])
        return sock

    def _sub(self, address: str) -> zmq.Socket:
        sock = self.context.socket(zmq.SUB)
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        sock.setsockopt(zmq.IPV6, address.startswith("tcp://["))
        if address.startswith("tcp://"):
            sock.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)
            sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
            sock.setsockopt(zmq.HEARTBEAT_TTL, HEARTBEAT_TIMEOUT_MS)
        sock.connect(address)
        return sock

    def _arm_finalizer(self) -> None:
        self._finalizer = weakref.finalize(self, _close, self.context, list(self._sockets),
                                           self.buffer, self._ipc_files, os.getpid(), 0)

    def export_handle(self) -> Handle:
        return self.handle

    # --- readiness -----------------------------------------------------------------------
    def wait_until_ready(self, timeout: float | None = 60.0) -> None:
        """Collective: the writer and every reader call it. The writer counts subscriptions
        through its XPUB sockets, then sends READY, which the readers wait for."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if self.is_writer:
            for sock, n in [(self.local_socket, self.n_local_reader),
                            (self.notify_socket, self.n_local_reader),
                            (self.remote_socket, self.n_remote_reader)]:
                if sock is not None and n:
                    self._count_subscriptions(sock, n, deadline)
            for sock in (self.local_socket, self.remote_socket):
                if sock is not None:
                    sock.send(READY)
        else:
            sock = self.local_socket or self.remote_socket
            frames = self._recv(sock, deadline, f"READY from the writer on {_endpoint(sock)}")
            if bytes(frames[0]) != READY:
                raise RuntimeError(f"expected READY from the writer, got {bytes(frames[0])[:32]!r}")

    def _count_subscriptions(self, sock: zmq.Socket, n: int, deadline: float | None) -> None:
        seen = 0
        while seen < n:
            what = f"{n} reader subscriptions on {_endpoint(sock)} (got {seen})"
            msg = self._recv(sock, deadline, what)[0]
            seen += bytes(msg)[:1] == b"\x01"  # \x01 subscribe, \x00 unsubscribe

    # --- writer --------------------------------------------------------------------------
    def enqueue(self, obj: Any, timeout: float | None = None) -> None:
        """Broadcast obj to every reader; wait at most timeout s for a free chunk."""
        # The body is encoded into one reused buffer, then copied into the chunk: no new
        # bytes object per message (see _send for the one exception). A reader raises here.
        frames = self._encode_into(obj, self._body)
        ring = self.buffer
        if ring is not None:
            idx = self.current_idx
            packed = ring.write(idx, _pack_into, frames)
            if packed is NOT_READY:
                self._wait_writable(idx, timeout)
                packed = ring.write(idx, _pack_into, frames)
            self.current_idx = idx + 1 if idx + 1 < ring.max_chunks else 0
            if not packed:  # overflow: the chunk keeps the place, the frames go on the socket
                self._send(self.local_socket, frames)
            if ring.buf[ring.waiting_offset]:  # a reader is about to block (spin_condition.py)
                self._wake_readers()
        if self.remote_socket is not None:
            self._send(self.remote_socket, frames)

    def _wake_readers(self) -> None:
        if self.buffer.take_waiting():
            self.notify_socket.send(b"\x00")  # CONFLATE: at most one is pending per reader

    def _send(self, sock: zmq.Socket, frames: list) -> None:
        sock.send_multipart(frames, copy=False)
        self._body = bytearray()  # zmq may still read the old body: never write it again

    def _wait_writable(self, idx: int, timeout: float | None) -> None:
        start, pause = time.monotonic(), 0.0
        while not self.buffer.writable(idx):
            if self.shutting_down:
                raise QueueShutdown("enqueue() interrupted: the MessageQueue was shut down")
            waited = time.monotonic() - start
            if timeout is not None and waited > timeout:
                raise TimeoutError(
                    f"writer waited {timeout:g} s for chunk {idx} of ring {self.buffer.name} to be "
                    f"read by reader(s) {self.buffer.unread_by(idx)} of {self.buffer.n_reader}: "
                    "is that reader process alive and still calling dequeue()?")
            if waited < WRITER_SPIN_S:
                os.sched_yield()
            else:
                pause = min(WRITER_MAX_SLEEP_S, pause * 2 or WRITER_MIN_SLEEP_S)
                time.sleep(pause)

    # --- readers -------------------------------------------------------------------------
    def dequeue(self, timeout: float | None = None) -> Any:
        """The next message, in order; TimeoutError after timeout s without one. A message
        that does not decode raises DecodeError and is consumed: the next call reads the next."""
        ring = self._read_ring
        if ring is None:  # a remote reader, or the writer (which gets an error there)
            return self._dequeue_remote(timeout)
        if self._overflow_pending:  # a timeout left this message's frames on the socket
            return self._recv_overflow(None if timeout is None else time.monotonic() + timeout)
        idx, rank = self.current_idx, self.local_reader_rank
        deadline = None  # computed only when the reader has to wait
        try:
            obj = ring.read(idx, rank, self._decode_chunk)
            if obj is NOT_READY:
                deadline = self._wait_readable(idx, timeout)
                obj = ring.read(idx, rank, self._decode_chunk)
        except DecodeError:
            self._advance(idx)  # ring.read released the chunk: the bad message is consumed
            raise
        self._advance(idx)
        if obj is _OVERFLOWED:  # the frames come on the socket, in the same order
            if deadline is None and timeout is not None:
                deadline = time.monotonic() + timeout
            self._overflow_pending = True
            return self._recv_overflow(deadline)
        return obj

    def _dequeue_remote(self, timeout: float | None) -> Any:
        if self.remote_socket is None or self.is_writer:
            raise RuntimeError("only readers dequeue; the writer calls enqueue()")
        deadline = None if timeout is None else time.monotonic() + timeout
        frames = self._recv(self.remote_socket, deadline, "a message from the writer over tcp")
        return self.decoder.decode(frames)

    def _advance(self, idx: int) -> None:
        """Past chunk idx; at the wrap, drain stale notifications if it is time."""
        if idx + 1 < self.buffer.max_chunks:
            self.current_idx = idx + 1
        else:
            self.current_idx = 0
            self.spin.drain_if_due(time.monotonic())

    def _recv_overflow(self, deadline: float | None) -> Any:
        """The message of the overflow chunk already released. A timeout here keeps the debt:
        the next dequeue() waits for these frames first, so no message is lost or reordered."""
        frames = self._recv(self.local_socket, deadline,
                            "an overflow message on " + _endpoint(self.local_socket))
        self._overflow_pending = False
        return self.decoder.decode(frames)

    def _wait_readable(self, idx: int, timeout: float | None) -> float | None:
        """Spin, then block, until chunk idx is readable; return the deadline."""
        rank, ring, spin = self.local_reader_rank, self.buffer, self.spin
        deadline = None if timeout is None else time.monotonic() + timeout
        ready = lambda: ring.readable(idx, rank)  # noqa: E731
        spin.begin_wait()
        while not ring.readable(idx, rank):  # one clock read a round: spinning is hot too
            if self.shutting_down:
                raise QueueShutdown("dequeue() interrupted: the MessageQueue was shut down")
            now = time.monotonic()
            if deadline is not None and now > deadline:
                raise TimeoutError(
                    f"reader {rank} waited {timeout:g} s for chunk {idx} of ring {ring.name} to be "
                    "written: is the writer alive and enqueueing?")
            spin.wait(now, deadline, ready)
        spin.end_wait()
        return deadline

    def _recv(self, sock: zmq.Socket, deadline: float | None, what: str) -> list:
        while not sock.poll(_poll_ms(deadline)):
            if self.shutting_down:
                raise QueueShutdown(f"interrupted while waiting for {what}: shut down")
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"timed out waiting for {what}")
        return sock.recv_multipart(copy=False)

    # --- lifetime ------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Wake a reader blocked in dequeue() (from another thread); it raises QueueShutdown."""
        self.shutting_down = True
        if self.spin is not None:
            self.spin.cancel()

    def close(self) -> None:
        """Close the sockets and the ring; the writer also removes the segment."""
        if self._finalizer.alive:
            self._finalizer.detach()
            # a reader has nothing to deliver: lingering only waited for a gone writer (1 s)
            _close(self.context, self._sockets, self.buffer, self._ipc_files, os.getpid(),
                   CLOSE_LINGER_MS if self.is_writer else 0)

    def __enter__(self) -> "MessageQueue":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# A blocked poll wakes at least this often to look at shutting_down.
_SHUTDOWN_POLL_MS = 100


def _only_the_writer(obj: Any, body: bytearray) -> list:
    raise RuntimeError("only the writer enqueues; readers call dequeue()")


def _poll_ms(deadline: float | None) -> int:
    if deadline is None:
        return _SHUTDOWN_POLL_MS
    return max(0, min(_SHUTDOWN_POLL_MS, int((deadline - time.monotonic()) * 1000)))


def _endpoint(sock: zmq.Socket) -> str:
    return sock.getsockopt(zmq.LAST_ENDPOINT).decode()


def _close(context: zmq.Context, sockets: list, ring: ShmRingBuffer | None, ipc_files: list[str],
           owner_pid: int, linger_ms: int) -> None:
    if os.getpid() != owner_pid:  # a forked child's copy: the parent owns these
        return
    for sock in sockets:
        sock.close(linger=linger_ms)
    context.term()
    for path in ipc_files:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    if ring is not None:
        ring.close()
