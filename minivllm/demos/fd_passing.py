"""Passing a file descriptor over a Unix socket (SCM_RIGHTS), against sending the bytes.
Chapter 02 runs it; the child lives here, in a module, because spawn cannot import a function
defined in a notebook.

The parent puts `size` bytes in a memfd (an anonymous file: nothing in /dev/shm to leak). Then,
on one Unix stream socket to a child, it either sends the bytes, or sends the descriptor as
SCM_RIGHTS ancillary data: the kernel installs a new descriptor, to the same open file, in the
child, which maps it and reads the pages in place.

Wire, one request and one reply per round:

    request  b"B" | size (8 B, little-endian) | size bytes      the bytes themselves
             b"F" | size (8 B)  + one fd as SCM_RIGHTS          the descriptor only
    reply    last byte (1 B) | the child's fd number (4 B) | inode the child sees (8 B)
"""

from __future__ import annotations

import mmap
import os
import socket
import statistics
import tempfile
import time

from minivllm.utils.mp import launch

HEADER = 9  # kind (1 B) + size (8 B)
REPLY = 13  # last byte (1 B) + fd number (4 B) + inode (8 B)
FILL = 7  # every payload byte, so the child's reply proves what it read


def _recv_exactly(sock: socket.socket, n: int, into: bytearray | None = None) -> bytes:
    buf = into if into is not None else bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:n])
        if not k:
            raise EOFError(f"peer closed after {got} of {n} bytes")
        got += k
    return bytes(view[n - 1:n])  # the last byte: all the caller needs


def receiver(link, path: str) -> None:
    """The child: connect to `path`, answer requests until the parent closes the socket."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(path)
        link.ready(os.getpid())
        scratch = bytearray()
        while True:
            head, fds, _, _ = socket.recv_fds(sock, HEADER, 1)
            if not head:
                return
            head += _recv_exactly(sock, HEADER - len(head)) if len(head) < HEADER else b""
            kind, size = head[:1], int.from_bytes(head[1:HEADER], "little")
            if kind == b"F":
                fd = fds[0]
                with mmap.mmap(fd, size, prot=mmap.PROT_READ) as pages:
                    last = pages[size - 1:size]
                reply = last + fd.to_bytes(4, "little") + os.fstat(fd).st_ino.to_bytes(8, "little")
                os.close(fd)
            else:
                if len(scratch) < size:
                    scratch = bytearray(size)
                last = _recv_exactly(sock, size, scratch)
                reply = last + (0).to_bytes(12, "little")
            sock.sendall(reply)


def _round(conn: socket.socket, kind: bytes, size: int, fd: int, payload: memoryview) -> tuple[float, bytes]:
    start = time.perf_counter()
    head = kind + size.to_bytes(8, "little")
    if kind == b"F":
        socket.send_fds(conn, [head], [fd])
    else:
        conn.sendall(head)
        conn.sendall(payload)
    reply = bytearray(REPLY)
    _recv_exactly(conn, REPLY, reply)
    return time.perf_counter() - start, bytes(reply)


def measure(sizes: list[int], repeats: int) -> list[dict]:
    """Median round-trip time of sending `size` bytes vs sending their descriptor, per size."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="minivllm-fd-") as d, \
            socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        path = os.path.join(d, "fd.sock")
        server.bind(path)
        server.listen(1)
        with launch(receiver, "fd-receiver", args=(path,)):
            conn, _ = server.accept()
            with conn:
                for size in sizes:
                    rows.append(_measure_size(conn, size, repeats))
    return rows


def _measure_size(conn: socket.socket, size: int, repeats: int) -> dict:
    fd = os.memfd_create("minivllm-fd-passing")
    try:
        os.ftruncate(fd, size)
        with mmap.mmap(fd, size) as pages:
            pages[:] = bytes([FILL]) * size
            payload = memoryview(pages)
            try:
                times = {}
                for kind in (b"B", b"F"):
                    results = [_round(conn, kind, size, fd, payload) for _ in range(repeats)]
                    times[kind] = statistics.median(t for t, _ in results)
                    reply = results[-1][1]
                    assert reply[0] == FILL, f"the child read {reply[0]}, not {FILL}"
            finally:
                payload.release()
        child_fd = int.from_bytes(reply[1:5], "little")
        child_inode = int.from_bytes(reply[5:13], "little")
        return {"size": size, "bytes_ms": times[b"B"] * 1e3, "fd_ms": times[b"F"] * 1e3,
                "bytes_over_fd": times[b"B"] / times[b"F"], "runs": repeats,
                "our_fd": fd, "child_fd": child_fd,
                "same_file": child_inode == os.fstat(fd).st_ino}
    finally:
        os.close(fd)
