"""ZMQ sockets the way the engine uses them: a factory with vLLM's defaults, addresses, identities.

- `make_zmq_socket(ctx, path, type)` binds or connects, and sets what the engine relies on:
  no high-water mark on the pipes that carry requests and outputs (a full pipe would block the
  busy loop or, for ROUTER, silently drop), the kernel buffer size, linger, XPUB_VERBOSE.
- `ipc_address(tag)`: a fresh ipc:// endpoint. `IpcDir` owns a directory for several, and
  removes it, and every file in it, on close. Both live in the run's private folder (mode 0700,
  utils/run_dir.py), which the survivor removes: no socket file outlives a killed process, and
  no other user can connect.
- `tcp://host:0` binds to a free port; `bound_address(sock)` tells which.
- `reuse_large_receive_buffers()`: allocator settings for a process that receives large frames.
- `dp_rank_identity(rank)`: a DEALER's identity is its data-parallel rank as 2 bytes, little
  endian, so a ROUTER addresses engine 3 as b"\\x03\\x00".

In vLLM: vllm/utils/network_utils.py, make_zmq_socket (and _get_zmq_socket_buffer_size, the
large-buffer policy) and get_open_zmq_ipc_path (a fresh ipc path per engine); the identity,
rank.to_bytes(2, "little"), in MPClient.__init__ (vllm/v1/engine/core_client.py).
"""

from __future__ import annotations

import ctypes
import os
import secrets
import shutil
import tempfile
import weakref
from typing import Any

import psutil
import zmq

from minivllm.utils.run_dir import process_dir, run_dir

# vLLM gives each socket 0.5 GiB of kernel buffer on big machines and leaves the system
# default elsewhere, so that a small host does not pin gigabytes in socket buffers.
LARGE_BUFFER_SIZE = 512 * 1024**2
LARGE_BUFFER_MIN_TOTAL = 32 * 1024**3
LARGE_BUFFER_MIN_AVAILABLE = 16 * 1024**3
SYSTEM_DEFAULT_BUFFER = -1  # ZMQ_SNDBUF/RCVBUF -1: leave the OS default
UNLIMITED_HWM = 0  # ZMQ_SNDHWM/RCVHWM 0: queue without limit instead of blocking or dropping
IDENTITY_BYTES = 2  # DP rank as a little-endian u16: 65,536 engines is enough
MAX_IPC_PATH = 107  # sun_path holds 108 bytes with the terminating NUL

_RECV_SIDE = (zmq.PULL, zmq.DEALER, zmq.ROUTER)
_SEND_SIDE = (zmq.PUSH, zmq.DEALER, zmq.ROUTER)
_CONNECT_BY_DEFAULT = (zmq.PUSH, zmq.SUB, zmq.XSUB)  # as in vLLM: these usually connect


def socket_buffer_size() -> int:
    """The SNDBUF/RCVBUF to set: large only where memory is plentiful."""
    mem = psutil.virtual_memory()
    if mem.total > LARGE_BUFFER_MIN_TOTAL and mem.available > LARGE_BUFFER_MIN_AVAILABLE:
        return LARGE_BUFFER_SIZE
    return SYSTEM_DEFAULT_BUFFER


def make_zmq_socket(ctx: zmq.Context, path: str, socket_type: int, bind: bool | None = None,
                    identity: bytes | None = None, linger: int | None = None,
                    heartbeat: tuple[int, int] | None = None,
                    listener: Any = None) -> zmq.Socket:
    """Make a socket of `socket_type`, bind or connect it to `path`, and return it.

    bind defaults to True except for PUSH, SUB and XSUB. A tcp path with port 0 binds to a
    free port (see `bound_address`). heartbeat=(interval_ms, timeout_ms): ZMTP PINGs on every
    connection, dropped after timeout_ms of silence (a peer whose host vanished). The caller
    owns the socket: close it. listener: a socket.socket already bound to `path` and
    listening, which the ZMQ socket takes over (ZMQ_USE_FD, as vLLM's make_zmq_listener): the
    port was never free for another process to take.
    """
    sock = ctx.socket(socket_type)
    try:
        buf = socket_buffer_size()
        if socket_type in _RECV_SIDE:
            sock.setsockopt(zmq.RCVHWM, UNLIMITED_HWM)
            sock.setsockopt(zmq.RCVBUF, buf)
        if socket_type in _SEND_SIDE:
            sock.setsockopt(zmq.SNDHWM, UNLIMITED_HWM)
            sock.setsockopt(zmq.SNDBUF, buf)
        if identity is not None:
            sock.setsockopt(zmq.IDENTITY, identity)
        if linger is not None:
            sock.setsockopt(zmq.LINGER, linger)
        if heartbeat is not None:
            sock.setsockopt(zmq.HEARTBEAT_IVL, heartbeat[0])
            sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, heartbeat[1])
            sock.setsockopt(zmq.HEARTBEAT_TTL, heartbeat[1])
        if socket_type == zmq.XPUB:
            sock.setsockopt(zmq.XPUB_VERBOSE, 1)  # see every subscription, not only the first
        if path.startswith("tcp://["):
            sock.setsockopt(zmq.IPV6, 1)
        if listener is not None:
            sock.setsockopt(zmq.USE_FD, listener.detach())  # libzmq closes it from now on
        if bind if bind is not None else socket_type not in _CONNECT_BY_DEFAULT:
            sock.bind(_wildcard_port(path))
        else:
            sock.connect(path)
    except BaseException:
        sock.close(linger=0)
        raise
    return sock


def _wildcard_port(path: str) -> str:
    if path.startswith("tcp://") and path.endswith(":0"):
        return path[:-1] + "*"  # libzmq's spelling of "any free port"
    return path


def bound_address(sock: zmq.Socket) -> str:
    """The endpoint the socket last bound, with the real port: 'tcp://127.0.0.1:43511'."""
    return sock.getsockopt_string(zmq.LAST_ENDPOINT)


def tcp_address(host: str = "127.0.0.1", port: int = 0) -> str:
    """A tcp:// path; port 0 means 'pick a free one when binding'."""
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


def dp_rank_identity(rank: int) -> bytes:
    """The ROUTER-side identity of data-parallel engine `rank`: 2 bytes, little endian."""
    if not 0 <= rank < 1 << (8 * IDENTITY_BYTES):
        raise ValueError(f"DP rank must be in [0, 65535], got {rank}")
    return rank.to_bytes(IDENTITY_BYTES, "little")


def identity_to_rank(identity: bytes) -> int:
    """The inverse of dp_rank_identity, for the frame a ROUTER prepends."""
    if len(identity) != IDENTITY_BYTES:
        raise ValueError(f"expected a {IDENTITY_BYTES}-byte DP identity, got {identity!r}")
    return int.from_bytes(identity, "little")


def ipc_address(tag: str) -> str:
    """A fresh ipc:// endpoint for this process to bind, in its folder of the run's private
    folder. libzmq never unlinks the file, not even on close: the binder unlinks it when it
    closes the socket (MessageQueue does), and utils/run_dir.py removes what a killed process
    left."""
    return _checked(os.path.join(process_dir(), f"{tag}-{secrets.token_hex(4)}"))


def _checked(path: str) -> str:
    if len(path.encode()) > MAX_IPC_PATH:
        raise ValueError(f"ipc path {path!r} is longer than the {MAX_IPC_PATH} bytes a Unix "
                         "socket address holds: set TMPDIR to a shorter directory")
    return f"ipc://{path}"


class IpcDir:
    """A private (0700) directory for ipc:// socket files, removed with its contents on close.

        with IpcDir() as d:
            sock = make_zmq_socket(ctx, d.path("input"), zmq.ROUTER)
    """

    def __init__(self, tag: str = "zmq"):
        # inside the run's folder, which is private already; short, because an ipc path must
        # fit in sun_path (MAX_IPC_PATH).
        self.dir = tempfile.mkdtemp(prefix=f"{tag}-", dir=run_dir())
        self._finalizer = weakref.finalize(self, shutil.rmtree, self.dir, True)

    def path(self, name: str) -> str:
        """An ipc:// address for socket `name` inside the directory."""
        if "/" in name or not name:
            raise ValueError(f"socket name must be a plain file name, got {name!r}")
        return _checked(os.path.join(self.dir, name))

    def close(self) -> None:
        self._finalizer()

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def __enter__(self) -> IpcDir:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8
KEEP_FREED_BYTES = 1 << 30  # give memory back to the OS only past 1 GiB of free heap top


def reuse_large_receive_buffers() -> bool:
    """Make libzmq's receive buffers reuse memory: call before creating the zmq context.

    libzmq mallocs a buffer of the whole message for every frame it receives. glibc serves an
    allocation past 32 MiB with a fresh mmap and unmaps it on free, so a 64 MiB frame costs
    16,384 page faults on every receive: more than the copy out of the kernel. With mmap off,
    one arena and no trimming, the freed buffer stays in the heap and the next frame lands in
    pages already faulted. The price: memory freed after a burst is not returned to the OS
    (up to KEEP_FREED_BYTES). Returns False where the C library is not glibc.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return all(mallopt(param, value) == 1 for param, value in (
        (_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, KEEP_FREED_BYTES)))


def close_all(*sockets: zmq.Socket | None, linger: int = 0) -> None:
    """Close every socket given (None is skipped), dropping unsent messages after `linger` ms."""
    for sock in sockets:
        if sock is not None and not sock.closed:
            sock.close(linger=linger)
