"""The transports `minivllm bench ipc` compares, both ends of each.

The parent process receives; a child started with minivllm.utils.mp.launch sends. Per message:

    transport   how a message moves                                    copies of each byte
    pipe        write(2) into the kernel's pipe buffer, read(2) out     2 (user->kernel->user)
    unix        AF_UNIX stream socketpair: send/recv_into               2
    tcp         TCP over 127.0.0.1, NODELAY: send/recv_into             2 (+ the TCP stack)
    shm         the sender copies into a slot of a shared ring, then      1: the receiver reads
                counts it published; the receiver spins on that count     the slot in place
                and counts what it released; a pipe byte wakes a side
                only when it said it sleeps (ShmRing)
    shm_copy    the same, and the receiver copies the slot out          2, both in user space
    memcpy      one copy in one process (the limit; see ipc.py)         1

The child runs commands from a control pipe: ("bw", size, count) sends `count` messages,
("rtt", size, count) echoes `count` messages, ("stop",) returns.
"""

from __future__ import annotations

import fcntl
import mmap
import multiprocessing
import os
import socket
import time
from multiprocessing.connection import Connection
from multiprocessing.shared_memory import SharedMemory

import numpy as np

from minivllm.bench._ipc_shm_ring import (  # noqa: F401  (this module's API too)
    CTRL_BYTES, PING, PONG, RING_BYTES, SPIN_BEFORE_BLOCK_S, SPIN_TIMEOUT_S, ShmRing, _seq,
    slots_for)
from minivllm.utils.mp import ProcHandle, launch

COPIES_PER_BYTE = {"pipe": 2, "pipe_big": 2, "unix": 2, "tcp": 2, "shm": 1, "shm_copy": 2,
                   "memcpy": 1}
F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)  # Linux only
F_GETPIPE_SZ = getattr(fcntl, "F_GETPIPE_SZ", 1032)
PIPE_MAX_SIZE_FILE = "/proc/sys/fs/pipe-max-size"


def grow_pipe(fd: int) -> int:
    """Grow a pipe's buffer to pipe-max-size (or as far as the per-user limit lets); new size."""
    try:
        with open(PIPE_MAX_SIZE_FILE) as f:
            want = int(f.read())
    except OSError:
        want = 2**20
    while want > 65536:
        try:
            return fcntl.fcntl(fd, F_SETPIPE_SZ, want)
        except OSError:  # EPERM above pipe-user-pages-soft: try half
            want //= 2
    return fcntl.fcntl(fd, F_GETPIPE_SZ)


# --- a byte stream over two fds or a socket ----------------------------------------------
class FdStream:
    def __init__(self, rfd: int, wfd: int):
        self.rfd, self.wfd = rfd, wfd

    def send(self, view: memoryview) -> None:
        while view:
            view = view[os.write(self.wfd, view):]

    def recv_into(self, view: memoryview) -> None:
        while view:
            n = os.readv(self.rfd, [view])
            if n == 0:
                raise EOFError("the peer closed the pipe")
            view = view[n:]


class SockStream:
    def __init__(self, sock: socket.socket):
        self.sock = sock

    def send(self, view: memoryview) -> None:
        self.sock.sendall(view)

    def recv_into(self, view: memoryview) -> None:
        while view:
            n = self.sock.recv_into(view)
            if n == 0:
                raise EOFError("the peer closed the socket")
            view = view[n:]


# --- the child ------------------------------------------------------------------------------
def _child_channel(kind: str, ends: dict):
    if kind in ("pipe", "pipe_big"):
        return FdStream(ends["r"].fileno(), ends["w"].fileno())
    if kind in ("shm", "shm_copy"):
        return _child_ring(ends["name"], ends["bell"], ends["ack"])
    if kind == "unix":
        return SockStream(ends["sock"])
    if kind == "tcp":
        sock = socket.create_connection(("127.0.0.1", ends["port"]))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return SockStream(sock)
    raise ValueError(f"unknown transport {kind!r}")


def _child_ring(name: str, bell: Connection, ack: Connection) -> ShmRing:
    fd = os.open(f"/dev/shm/{name}", os.O_RDWR)  # not SharedMemory: the parent owns it
    mapped = mmap.mmap(fd, RING_BYTES + CTRL_BYTES, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE)
    os.close(fd)
    return ShmRing(memoryview(mapped), FdStream(0, bell.fileno()), FdStream(ack.fileno(), 0))


def peer_main(link, kind: str, ends: dict, ctrl: Connection) -> None:
    """The sending child of one transport (the target given to mp.launch)."""
    chan = _child_channel(kind, ends)
    src = np.full(max(RING_BYTES // 4, 1), 7, np.uint8)  # prefaulted source of every message
    link.ready(os.getpid())
    while True:
        cmd = ctrl.recv()
        if cmd[0] == "stop":
            break
        mode, size, count = cmd
        view = memoryview(src)[:size] if size <= len(src) else memoryview(np.ones(size, np.uint8))
        started = time.perf_counter()
        if mode == "bw" and kind.startswith("shm"):
            chan.send_stream(view, count)
        elif mode == "bw":
            for _ in range(count):
                chan.send(view)
        elif kind.startswith("shm"):
            buf = memoryview(bytearray(size))
            for i in range(count):
                chan.pong(buf, _seq(i))
        else:
            buf = memoryview(bytearray(size))
            for _ in range(count):
                chan.recv_into(buf)
                chan.send(buf)
        ctrl.send(("done", started))


# --- the parent -----------------------------------------------------------------------------
class Transport:
    """The receiving end of one transport and its sending child. Close it (or use `with`)."""

    def __init__(self, kind: str, ready_timeout: float = 60.0):
        self.kind, self.pipe_size, self._closers = kind, None, []
        ctrl_r, self.ctrl = multiprocessing.Pipe()  # commands down, ("done", start) back
        self.start_lags: list[float] = []  # seconds the sender took to begin each bandwidth run
        ends, self.chan = self._open(kind)
        try:
            self.child: ProcHandle = launch(peer_main, f"ipc-{kind}", args=(kind, ends, ctrl_r),
                                            ready_timeout=ready_timeout)
        except BaseException:
            self.close()
            raise
        finally:
            ctrl_r.close()
            for end in ends.values():
                if hasattr(end, "close"):
                    end.close()  # the child holds its own copies now
        if kind == "tcp":
            conn, _ = self._listener.accept()
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._closers.append(conn.close)
            self.chan = SockStream(conn)

    def _open(self, kind: str):
        if kind in ("pipe", "pipe_big"):
            (to_parent_r, to_parent_w), (to_child_r, to_child_w) = os.pipe(), os.pipe()
            if kind == "pipe_big":
                self.pipe_size = grow_pipe(to_parent_w)
                grow_pipe(to_child_w)
            else:
                self.pipe_size = fcntl.fcntl(to_parent_w, F_GETPIPE_SZ)
            self._closers += [lambda: os.close(to_parent_r), lambda: os.close(to_child_w)]
            ends = {"r": Connection(to_child_r), "w": Connection(to_parent_w)}
            return ends, FdStream(to_parent_r, to_child_w)
        if kind == "unix":
            mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            self._closers.append(mine.close)
            return {"sock": theirs}, SockStream(mine)
        if kind == "tcp":
            self._listener = socket.create_server(("127.0.0.1", 0))
            self._closers.append(self._listener.close)
            return {"port": self._listener.getsockname()[1]}, None
        if kind in ("shm", "shm_copy"):
            self._shm = SharedMemory(create=True, size=RING_BYTES + CTRL_BYTES)
            self._closers += [self._shm.unlink, self._shm.close]
            np.frombuffer(self._shm.buf, np.uint8)[:] = 0  # prefault: a first touch faults a page (chapter 02)
            bell_r, bell_w = os.pipe()
            ack_r, ack_w = os.pipe()
            self._closers += [lambda: os.close(bell_r), lambda: os.close(ack_w)]
            ends = {"name": self._shm.name, "bell": Connection(bell_w), "ack": Connection(ack_r)}
            ring = ShmRing(self._shm.buf, FdStream(bell_r, 0), FdStream(0, ack_w))
            self._closers.insert(2, ring.release)  # a view must go before close()
            return ends, ring
        raise ValueError(f"unknown transport {kind!r}: choose pipe, pipe_big, unix, tcp, shm or "
                         "shm_copy")

    def bandwidth(self, dst: memoryview, count: int) -> float:
        """Seconds to receive `count` messages of len(dst) bytes, from the sender's start to
        the last byte here. The command that starts a run is the bench's, not the transport's:
        the time the sender took to wake for it (perf_counter is CLOCK_MONOTONIC, one clock
        for both processes) is kept apart, in start_lags (chapter 05, section 4.7)."""
        start = time.perf_counter()
        self.ctrl.send(("bw", len(dst), count))
        if self.kind.startswith("shm"):
            self.chan.recv_stream(dst, count, copy_out=self.kind == "shm_copy")
        else:
            for _ in range(count):
                self.chan.recv_into(dst)
        end = time.perf_counter()
        sender_start = max(start, self._expect_done())
        self.start_lags.append(sender_start - start)
        return end - sender_start

    def round_trips(self, size: int, count: int) -> list[float]:
        """Seconds of each of `count` round trips of a `size`-byte message."""
        src, dst = memoryview(bytearray(b"p" * size)), memoryview(bytearray(size))
        if self.kind.startswith("shm"):
            self.chan.flags[PING] = self.chan.flags[PONG] = 0
        self.ctrl.send(("rtt", size, count))
        times = []
        for i in range(count):
            start = time.perf_counter()
            if self.kind.startswith("shm"):
                self.chan.ping(src, dst, _seq(i))
            else:
                self.chan.send(src)
                self.chan.recv_into(dst)
            times.append(time.perf_counter() - start)
        self._expect_done()
        return times

    def _expect_done(self) -> float:
        """The sender's perf_counter() when it began the run."""
        reply = self.ctrl.recv() if self.ctrl.poll(SPIN_TIMEOUT_S) else None
        if not (isinstance(reply, tuple) and reply[0] == "done"):
            raise RuntimeError(f"the {self.kind} sender did not finish its run")
        return reply[1]

    def close(self) -> None:
        child = getattr(self, "child", None)
        if child is not None:
            try:
                self.ctrl.send(("stop",))
            except OSError:
                pass
            child.shutdown()
        self.ctrl.close()
        while self._closers:
            self._closers.pop()()  # last opened, first closed

    def __enter__(self) -> "Transport":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

