"""ShmRingBuffer: the shared-memory segment under MessageQueue, with vLLM's layout.

The ring only knows bytes and flags. Waiting, serialization and sockets live in
shm_broadcast.py (MessageQueue); this file is the memory and the flag protocol.
"""

from __future__ import annotations

import os
import shutil
import threading
import weakref
from typing import Any, Callable
from multiprocessing import resource_tracker, shared_memory

from minivllm.utils.resource_names import shm_name

SHM_DIR = "/dev/shm"
MIB = 1 << 20
NOT_READY = object()  # write(): the chunk is not free yet; read(): nothing new in it yet

# A lock acquire + release as a fence, as vLLM does (vLLM: _memory_fence_lock in shm_broadcast.py).
# On x86 it is a full barrier: the mutex's atomic read-modify-write is a locked instruction.
# The C11 and ARMv8 models promise only acquire and release orderings for a lock, which do
# not order a store before a later load (chapter 05 says so).
_FENCE = threading.Lock()
# Bound once: the hot paths below fence three times per message on each side, and bound
# methods skip an attribute lookup per call (chapter 05 measures a fence).
_fence_in, _fence_out = _FENCE.acquire, _FENCE.release


def memory_fence() -> None:
    """Order every load and store before this call before every one after it (a full barrier
    on x86; see the note on _FENCE for other memory models)."""
    _fence_in()
    _fence_out()


def check_shm_free_space(required_bytes: int, shm_dir: str = SHM_DIR) -> None:
    """Raise before creating a segment that /dev/shm cannot hold.

    Without this check the segment is created sparse and the process dies of SIGBUS on
    the first write past the free space, far away from the cause.
    """
    if not os.path.isdir(shm_dir):
        return
    free = shutil.disk_usage(shm_dir).free
    if required_bytes > free:
        raise RuntimeError(
            f"{shm_dir} has {free / MIB:.0f} MiB free, the ring needs {required_bytes / MIB:.0f} MiB: "
            f"free space in {shm_dir} (remove stale segments), start docker with --shm-size=1g "
            "or --ipc=host, or make the ring smaller (max_chunk_bytes x max_chunks)")


class ShmRingBuffer:
    """One writer, n_reader readers, max_chunks chunks of max_chunk_bytes each.

    Memory layout (vLLM's, ShmRingBuffer.__init__ in shm_broadcast.py):

        +---------+---------+-----+-------------+--------+--------+-----+------------+---------+
        | chunk 0 | chunk 1 | ... | chunk n - 1 | meta 0 | meta 1 | ... | meta n - 1 | waiting |
        +---------+---------+-----+-------------+--------+--------+-----+------------+---------+
        | max_chunks x max_chunk_bytes          | max_chunks x (1 + n_reader) bytes  | 1 byte  |

        meta i = | written | read 0 | read 1 | ... | read n_reader - 1 |   one byte each

    The last byte is minivllm's, not vLLM's: a reader sets it before it blocks, and the writer
    wakes the readers only when it finds it set (mark_waiting, take_waiting).

    State table of one chunk (w = written flag, r_k = read flag of reader k):

        w  r_0..r_n-1   state      writer                     reader k
        0  any          empty      may fill it                waits
        1  all 0        fresh      waits                      may read
        1  some 1       partly     waits                      may read if r_k = 0
        1  all 1        consumed   may refill it              waits (nothing new)

    Transitions, in this order, with a memory fence between data and flags (each step is one
    method below, and write()/read() are those same methods in one call):
      writer: fence; check writable; w = 0; write the data; every r_k = 0; fence; w = 1; fence.
      reader k: fence; check w = 1 and r_k = 0; copy the data out; fence; r_k = 1; fence.
    Clearing the read flags before setting w keeps the chunk in "empty" until it is
    complete. The other order passes through "w = 1, r_k = 1" (consumed, with the new
    data already in place): a reader skips a message, or marks it read before the
    writer clears its flag and then reads it again on the next lap (chapter 05).

    Each side keeps its own current index; nobody stores it in the segment.
    The creator (name=None) zeroes the metadata and unlinks the segment on close();
    an attaching process (name given) only unmaps it. Pickling gives the handle.
    """

    def __init__(self, n_reader: int, max_chunk_bytes: int, max_chunks: int,
                 name: str | None = None):
        if n_reader < 1 or max_chunk_bytes < 1 or max_chunks < 1:
            raise ValueError(f"need n_reader, max_chunk_bytes, max_chunks >= 1, got "
                             f"{n_reader}, {max_chunk_bytes}, {max_chunks}")
        self.n_reader, self.max_chunk_bytes, self.max_chunks = n_reader, max_chunk_bytes, max_chunks
        self.metadata_size = 1 + n_reader
        self.metadata_offset = max_chunk_bytes * max_chunks
        self.total_bytes = (max_chunk_bytes + self.metadata_size) * max_chunks + 1
        self.waiting_offset = self.total_bytes - 1
        self.is_creator = name is None
        if self.is_creator:
            check_shm_free_space(self.total_bytes)
            self.shared_memory = shared_memory.SharedMemory(
                name=shm_name("ring"), create=True, size=self.total_bytes)
            self.shared_memory.buf[self.metadata_offset:self.total_bytes] = bytes(
                self.total_bytes - self.metadata_offset)
        else:
            self.shared_memory = _attach(name)
            if self.shared_memory.size < self.total_bytes:
                size = self.shared_memory.size
                self.shared_memory.close()
                raise ValueError(f"segment {name} has {size} bytes, the ring needs "
                                 f"{self.total_bytes}: the handle does not match the segment")
        self.name = self.shared_memory.name
        self.buf = self.shared_memory.buf
        # Precomputed: the hot paths below run once per message on every side.
        self._written = [self.metadata_offset + i * self.metadata_size for i in range(max_chunks)]
        self._none_read, self._all_read = bytes(n_reader), b"\x01" * n_reader
        self._finalizer = weakref.finalize(self, _release, self.shared_memory, self.is_creator,
                                           os.getpid())

    def handle(self) -> tuple[int, int, int, str]:
        return (self.n_reader, self.max_chunk_bytes, self.max_chunks, self.name)

    def __reduce__(self):
        return (self.__class__, self.handle())

    # --- offsets -------------------------------------------------------------------------
    def written_offset(self, idx: int) -> int:
        return self._written[idx]

    # --- the flag protocol ---------------------------------------------------------------
    def writable(self, idx: int) -> bool:
        """Chunk idx is empty or consumed by every reader."""
        w, buf = self._written[idx], self.buf
        memory_fence()
        return not buf[w] or buf[w + 1:w + self.metadata_size] == self._all_read

    def unread_by(self, idx: int) -> list[int]:
        """The readers that have not read chunk idx yet (for error messages)."""
        w = self._written[idx]
        return [k for k in range(self.n_reader) if not self.buf[w + 1 + k]]

    def begin_write(self, idx: int) -> memoryview:
        """Mark chunk idx empty and return its data (chunk(idx)) for the writer to fill."""
        self.buf[self._written[idx]] = 0
        return self.chunk(idx)

    def end_write(self, idx: int) -> None:
        """Publish chunk idx: clear the read flags first, then set the written flag."""
        w, buf = self._written[idx], self.buf
        buf[w + 1:w + self.metadata_size] = self._none_read
        memory_fence()  # the data and the cleared flags before w = 1
        buf[w] = 1
        memory_fence()  # w = 1 leaves this core's store buffer now

    def readable(self, idx: int, reader: int) -> bool:
        w, buf = self._written[idx], self.buf
        memory_fence()
        return buf[w] == 1 and buf[w + 1 + reader] == 0

    def chunk(self, idx: int) -> memoryview:
        start = idx * self.max_chunk_bytes
        return self.buf[start:start + self.max_chunk_bytes]

    def end_read(self, idx: int, reader: int) -> None:
        """Release chunk idx for this reader; call it only after the data is copied out."""
        memory_fence()  # the copy-out completes before the writer can see r_k = 1
        self.buf[self._written[idx] + 1 + reader] = 1
        memory_fence()

    # --- the same steps, one call per message (MessageQueue's hot path) -------------------
    def write(self, idx: int, fill: Callable[[memoryview, int, int, Any], Any], arg: Any) -> Any:
        """If chunk idx is writable: begin_write, fill(buf, start, max_chunk_bytes, arg),
        end_write, and return what fill returned. Else return NOT_READY and touch nothing."""
        if not self.writable(idx):
            return NOT_READY
        self.begin_write(idx).release()
        result = fill(self.buf, idx * self.max_chunk_bytes, self.max_chunk_bytes, arg)
        self.end_write(idx)
        return result

    def read(self, idx: int, reader: int, copy_out: Callable[[memoryview, int], Any]) -> Any:
        """If chunk idx is readable by reader: copy_out(buf, start), end_read, and return what
        copy_out returned (a copy, or a message decoded from the chunk: nothing that refers to
        it, since the writer may refill it right after). Else return NOT_READY. If copy_out
        raises, the chunk is released all the same: a message that cannot be read is consumed,
        not read again forever."""
        if not self.readable(idx, reader):
            return NOT_READY
        try:
            return copy_out(self.buf, idx * self.max_chunk_bytes)
        finally:
            self.end_read(idx, reader)

    # --- the waiting flag: a reader about to block, and the writer that must wake it -----
    def mark_waiting(self) -> None:
        """Reader: set the flag, then fence; look at the ring once more before blocking.

        Dekker's order, on the same fences as the chunks' flags: the reader stores waiting = 1
        and then loads written; the writer stores written = 1 (end_write fences after it) and
        then loads waiting. At least one of them sees the other's store, so either the
        reader's last look finds the chunk, or the writer finds the flag and wakes it.
        """
        self.buf[self.waiting_offset] = 1
        memory_fence()

    def take_waiting(self) -> bool:
        """Writer, after end_write: was a reader about to block? Clears the flag. A reader that
        sets it again meanwhile is woken by the caller's notification all the same."""
        if not self.buf[self.waiting_offset]:
            return False
        self.buf[self.waiting_offset] = 0
        return True

    def close(self) -> None:
        """Unmap the segment; the creator also unlinks it. Views from chunk() must be gone."""
        self.buf = None
        self._finalizer()


def _attach(name: str) -> shared_memory.SharedMemory:
    """Open an existing segment without registering it with this process's resource tracker.

    Python < 3.13 registers attached segments too, and the tracker then unlinks the
    writer's segment when a reader exits (https://bugs.python.org/issue39959).
    vLLM patches the tracker the same way: ShmRingBuffer.__init__ in shm_broadcast.py.
    """
    register = resource_tracker.register
    resource_tracker.register = lambda name, rtype: None
    try:
        return shared_memory.SharedMemory(name=name)
    except FileNotFoundError:
        raise FileNotFoundError(f"shared-memory segment {name} does not exist: its creator closed "
                                "it or exited before this process attached") from None
    finally:
        resource_tracker.register = register


def _release(shm: shared_memory.SharedMemory, is_creator: bool, owner_pid: int) -> None:
    if os.getpid() != owner_pid:  # a forked child inherited the object: not ours to free
        return
    try:
        shm.close()
    except BufferError:
        pass  # a view is still exported; the mapping goes when the process exits
    if is_creator:
        try:
            shm.unlink()
        except FileNotFoundError:
            pass
