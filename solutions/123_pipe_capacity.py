"""Exercise 123, reference answer: grow a pipe, and count the context switches a transfer costs.

A pipe holds 64 KiB by default. A writer that fills it blocks (a voluntary context switch)
until the reader drains it; a bigger pipe means fewer, longer runs on each side, so fewer
switches per MiB. F_SETPIPE_SZ grows it up to /proc/sys/fs/pipe-max-size for an unprivileged
process (EPERM above that, or above the per-user page budget pipe-user-pages-soft).
"""

from __future__ import annotations

import fcntl
import os
import select
import signal
import time
from dataclasses import dataclass

PIPE_MAX_SIZE_FILE = "/proc/sys/fs/pipe-max-size"
F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)  # Linux values, for Pythons without them  # pragma: no mutate
F_GETPIPE_SZ = getattr(fcntl, "F_GETPIPE_SZ", 1032)  # pragma: no mutate
PATTERN = bytes(range(256))  # byte i of a transfer is i % 256
WRITE_CHUNK = 1 << 20  # bytes the writer hands to one os.write
READ_CHUNK = 1 << 20  # bytes the reader asks of one os.read
MIB = 1 << 20


def pipe_max_size(path: str = PIPE_MAX_SIZE_FILE) -> int:
    """The largest pipe an unprivileged process may ask for, read from `path`."""
    with open(path) as f:
        text = f.read()
    try:
        return int(text.strip())
    except ValueError:
        raise ValueError(f"{path} should hold a byte count, got {text[:40]!r}") from None


def grow_pipe(fd: int, want: int) -> int:
    """Grow the pipe behind fd to at least `want` bytes, or as far as allowed; the new size.

    On EPERM the request is halved and retried; it never shrinks the pipe. Other errors
    (EBADF for a non-pipe) propagate.
    """
    if want <= 0:
        raise ValueError(f"a pipe size must be positive, got {want}")
    current = fcntl.fcntl(fd, F_GETPIPE_SZ)
    while want > current:
        try:
            return fcntl.fcntl(fd, F_SETPIPE_SZ, want)
        except PermissionError:  # above pipe-max-size or the user's page budget
            want //= 2
    return current


def voluntary_switches(pid: int) -> int:
    """The voluntary context switches of a live process so far (its main thread)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("voluntary_ctxt_switches:"):
                    return int(line.split()[1])
    except FileNotFoundError:
        raise ProcessLookupError(f"no process {pid}") from None
    raise RuntimeError(f"/proc/{pid}/status has no voluntary_ctxt_switches line")


def pattern_bytes(start: int, n: int) -> bytes:
    """Bytes start .. start+n of a transfer."""
    head = start % len(PATTERN)
    return (PATTERN * ((head + n) // len(PATTERN) + 1))[head:head + n]


class Writer:
    """A forked child that writes `total` pattern bytes into a fresh pipe grown to pipe_size."""

    def __init__(self, total: int, pipe_size: int):
        self.total = total
        self.read_fd, write_fd = os.pipe()
        try:
            self.pipe_size = grow_pipe(write_fd, pipe_size)
        except BaseException:
            os.close(self.read_fd)
            os.close(write_fd)
            raise
        self.pid = os.fork()
        if self.pid == 0:  # the child: write everything, then exit without Python's cleanup
            code = 1
            try:
                os.close(self.read_fd)
                _write_all(write_fd, total)
                code = 0
            finally:
                os._exit(code)
        os.close(write_fd)  # else the reader never sees EOF: a write end stays open here

    def finish(self, timeout: float = 10.0) -> int:
        """Reap the child; its voluntary context switches (from wait4's rusage). Closes the
        read end; a child still running after `timeout` is killed and TimeoutError raised."""
        os.close(self.read_fd)  # a writer still writing now gets EPIPE instead of blocking
        deadline = time.monotonic() + timeout
        while True:
            pid, status, usage = os.wait4(self.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                os.kill(self.pid, signal.SIGKILL)
                os.wait4(self.pid, 0)
                raise TimeoutError(f"the writer {self.pid} did not exit within {timeout:g} s")
            time.sleep(0.005)
        if os.waitstatus_to_exitcode(status) != 0:
            raise RuntimeError(f"the writer exited with {os.waitstatus_to_exitcode(status)}")
        return usage.ru_nvcsw

    def kill(self) -> None:
        """Stop and reap the child at once (the reading side failed); close the read end."""
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        os.close(self.read_fd)


def _write_all(fd: int, total: int) -> None:
    block = PATTERN * (WRITE_CHUNK // len(PATTERN))
    sent = 0
    while sent < total:
        view = memoryview(block)[:min(WRITE_CHUNK, total - sent)]
        while view:
            view = view[os.write(fd, view):]
        sent += min(WRITE_CHUNK, total - sent)


@dataclass
class Transfer:
    bytes: int
    pipe_size: int
    writer_switches: int
    reader_switches: int

    @property
    def switches_per_mib(self) -> float:
        return (self.writer_switches + self.reader_switches) / (self.bytes / MIB)


def transfer(total: int, pipe_size: int, timeout: float = 30.0) -> Transfer:
    """Move `total` bytes from a forked writer to this process through a pipe of pipe_size."""
    if total <= 0:
        raise ValueError(f"transfer at least one byte, got total={total}")
    writer = Writer(total, pipe_size)
    received = 0
    try:
        before = voluntary_switches(os.getpid())
        deadline = time.monotonic() + timeout
        while True:
            left = max(0.0, deadline - time.monotonic())
            if not select.select([writer.read_fd], [], [], left)[0]:
                raise TimeoutError(f"received {received} of {total} bytes within {timeout:g} s")
            data = os.read(writer.read_fd, READ_CHUNK)
            if not data:
                break
            if data != pattern_bytes(received, len(data)):
                raise ValueError(f"the bytes at offset {received} are not the pattern")
            received += len(data)
        reader = voluntary_switches(os.getpid()) - before
    except BaseException:
        writer.kill()
        raise
    writer_switches = writer.finish()
    if received != total:
        raise ValueError(f"received {received} bytes, expected {total}")
    return Transfer(received, writer.pipe_size, writer_switches, reader)
