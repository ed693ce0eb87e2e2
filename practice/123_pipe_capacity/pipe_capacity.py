"""Exercise 123: grow a pipe, and count the context switches of a transfer (see README.md)."""

from __future__ import annotations

import fcntl
import os
import select
import signal
import time
from dataclasses import dataclass

PIPE_MAX_SIZE_FILE = "/proc/sys/fs/pipe-max-size"
F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)  # Linux values, for Pythons without them
F_GETPIPE_SZ = getattr(fcntl, "F_GETPIPE_SZ", 1032)
PATTERN = bytes(range(256))  # byte i of a transfer is i % 256
MIB = 1 << 20


def pipe_max_size(path: str = PIPE_MAX_SIZE_FILE) -> int:
    """The largest pipe an unprivileged process may ask for, read from `path`."""
    raise NotImplementedError("TODO: read the file; int() of its text; a ValueError naming path")


def grow_pipe(fd: int, want: int) -> int:
    """Grow the pipe behind fd to at least `want` bytes, or as far as allowed; the new size."""
    raise NotImplementedError("TODO: F_SETPIPE_SZ; on PermissionError halve the request; "
                              "never shrink; let every other OSError through")


def voluntary_switches(pid: int) -> int:
    """The voluntary context switches of a live process so far (its main thread)."""
    raise NotImplementedError("TODO: the 'voluntary_ctxt_switches:' line of /proc/<pid>/status")


class Writer:
    """A forked child that writes `total` pattern bytes into a fresh pipe grown to pipe_size."""

    def __init__(self, total: int, pipe_size: int):
        self.total = total
        raise NotImplementedError("TODO: os.pipe(), grow it, os.fork(); the child writes and "
                                  "os._exit()s; set read_fd, pipe_size, pid")

    def finish(self, timeout: float = 10.0) -> int:
        """Reap the child; its voluntary context switches. Closes the read end."""
        raise NotImplementedError("TODO: os.wait4(pid, ...) gives the child's rusage")

    def kill(self) -> None:
        """Stop and reap the child at once (the reading side failed); close the read end."""
        raise NotImplementedError("TODO: SIGKILL, waitpid, close")


@dataclass
class Transfer:
    bytes: int
    pipe_size: int
    writer_switches: int
    reader_switches: int

    @property
    def switches_per_mib(self) -> float:
        raise NotImplementedError("TODO: (writer + reader switches) per MiB moved")


def transfer(total: int, pipe_size: int, timeout: float = 30.0) -> Transfer:
    """Move `total` bytes from a forked writer to this process through a pipe of pipe_size."""
    raise NotImplementedError("TODO: a Writer; read to EOF, checking the pattern; count this "
                              "process's switches around the loop; finish the writer")
