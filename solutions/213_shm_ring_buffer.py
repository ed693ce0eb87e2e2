"""Exercise 213, reference solution: a shared-memory broadcast ring buffer.

One writer, N readers. The buffer holds n_chunks data chunks, then the metadata:

    [ chunk 0 | chunk 1 | ... | chunk n-1 | meta 0 | meta 1 | ... | meta n-1 ]

    chunk i = 4-byte little-endian payload length, then the payload
    meta i  = 1 + n_readers bytes: the written flag, then one read flag per reader

State table of one chunk's flags (w = written flag, r_k = read flag of reader k):

    w=0              empty: the writer may fill it
    w=1, some r_k=0  full: reader k has not read it yet; the writer must wait
    w=1, all r_k=1   consumed: the writer may overwrite it

The writer clears every read flag BEFORE it sets the written flag. Otherwise a reader that
was fast enough would see w=1 with its stale r_k=1 from the chunk's previous round, or,
worse, set r_k=1 for the new message just before the writer clears it, and read the same
message again on the next lap. A reader copies the payload out BEFORE it sets its read flag.
"""

from __future__ import annotations

from multiprocessing import shared_memory

HEADER = 4  # bytes of the little-endian payload length at the start of each chunk


def buffer_size(n_readers: int, n_chunks: int, chunk_bytes: int) -> int:
    return n_chunks * chunk_bytes + n_chunks * (1 + n_readers)


def chunk_offset(chunk: int, chunk_bytes: int) -> int:
    return chunk * chunk_bytes


def written_flag_offset(chunk: int, n_readers: int, n_chunks: int, chunk_bytes: int) -> int:
    return n_chunks * chunk_bytes + chunk * (1 + n_readers)


def read_flag_offset(chunk: int, reader: int, n_readers: int, n_chunks: int, chunk_bytes: int) -> int:
    return written_flag_offset(chunk, n_readers, n_chunks, chunk_bytes) + 1 + reader


class RingWriter:
    def __init__(self, buf, n_readers: int, n_chunks: int, chunk_bytes: int):  # pragma: no mutate block
        self.buf, self.n_readers = buf, n_readers
        self.n_chunks, self.chunk_bytes = n_chunks, chunk_bytes
        self.index = 0  # the next chunk to write

    def try_write(self, payload: bytes) -> bool:
        """Write payload into the next chunk if it is free; return False if it is not."""
        if len(payload) > self.chunk_bytes - HEADER:
            raise ValueError(f"payload of {len(payload)} bytes does not fit a chunk of "
                             f"{self.chunk_bytes - HEADER} payload bytes")
        w = written_flag_offset(self.index, self.n_readers, self.n_chunks, self.chunk_bytes)
        if self.buf[w] and sum(self.buf[w + 1:w + 1 + self.n_readers]) != self.n_readers:
            return False  # written and not yet read by every reader
        start = chunk_offset(self.index, self.chunk_bytes)
        self.buf[start:start + HEADER] = len(payload).to_bytes(HEADER, "little")
        self.buf[start + HEADER:start + HEADER + len(payload)] = payload
        for r in range(self.n_readers):  # first clear the read flags ...
            self.buf[w + 1 + r] = 0
        self.buf[w] = 1  # ... then publish
        self.index = (self.index + 1) % self.n_chunks
        return True


class RingReader:
    def __init__(self, buf, reader: int, n_readers: int, n_chunks: int, chunk_bytes: int):  # pragma: no mutate block
        self.buf, self.reader, self.n_readers = buf, reader, n_readers
        self.n_chunks, self.chunk_bytes = n_chunks, chunk_bytes
        self.index = 0  # the next chunk to read

    def try_read(self) -> bytes | None:
        """Return the next message for this reader, or None if it has not been written yet."""
        w = written_flag_offset(self.index, self.n_readers, self.n_chunks, self.chunk_bytes)
        if not self.buf[w] or self.buf[w + 1 + self.reader]:
            return None  # not written yet, or already read by us: the writer has not lapped
        start = chunk_offset(self.index, self.chunk_bytes)
        size = int.from_bytes(self.buf[start:start + HEADER], "little")
        payload = bytes(self.buf[start + HEADER:start + HEADER + size])  # copy out first ...
        self.buf[w + 1 + self.reader] = 1  # ... then release the chunk
        self.index = (self.index + 1) % self.n_chunks
        return payload


class ShmRing:
    """Owns (name=None: creates) or attaches to (name given) the segment holding a ring."""

    def __init__(self, n_readers: int, n_chunks: int, chunk_bytes: int, name: str | None = None):
        self.n_readers, self.n_chunks, self.chunk_bytes = n_readers, n_chunks, chunk_bytes
        size = buffer_size(n_readers, n_chunks, chunk_bytes)
        self.is_creator = name is None
        if self.is_creator:
            self.shm = shared_memory.SharedMemory(create=True, size=size)
            self.shm.buf[:size] = bytes(size)  # all flags start at 0
        else:
            self.shm = shared_memory.SharedMemory(name=name)
        self.name = self.shm.name

    def writer(self) -> RingWriter:  # pragma: no mutate block
        return RingWriter(self.shm.buf, self.n_readers, self.n_chunks, self.chunk_bytes)

    def reader(self, reader: int) -> RingReader:  # pragma: no mutate block
        return RingReader(self.shm.buf, reader, self.n_readers, self.n_chunks, self.chunk_bytes)

    def close(self) -> None:
        """Unmap the segment in this process. Every process calls it once."""
        self.shm.close()

    def unlink(self) -> None:
        """Remove the segment's name from /dev/shm. Only the creator calls it, once."""
        if self.is_creator:
            self.shm.unlink()
