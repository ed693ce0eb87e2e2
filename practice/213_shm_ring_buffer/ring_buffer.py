"""Exercise 213: a shared-memory broadcast ring buffer. Read README.md in this folder.

Layout:  [ chunk 0 | ... | chunk n-1 | meta 0 | ... | meta n-1 ]
  chunk i = 4-byte little-endian payload length, then the payload
  meta i  = 1 + n_readers bytes: the written flag, then one read flag per reader

Replace every `raise NotImplementedError` and grade with: python judge.py 213
"""

from __future__ import annotations

from multiprocessing import shared_memory

HEADER = 4  # bytes of the little-endian payload length at the start of each chunk


def buffer_size(n_readers: int, n_chunks: int, chunk_bytes: int) -> int:
    # TODO: bytes for all data chunks plus all metadata
    raise NotImplementedError


def chunk_offset(chunk: int, chunk_bytes: int) -> int:
    # TODO: where chunk `chunk` starts
    raise NotImplementedError


def written_flag_offset(chunk: int, n_readers: int, n_chunks: int, chunk_bytes: int) -> int:
    # TODO: where the written flag of chunk `chunk` is
    raise NotImplementedError


def read_flag_offset(chunk: int, reader: int, n_readers: int, n_chunks: int, chunk_bytes: int) -> int:
    # TODO: where reader `reader`'s read flag of chunk `chunk` is
    raise NotImplementedError


class RingWriter:
    def __init__(self, buf, n_readers: int, n_chunks: int, chunk_bytes: int):
        self.buf, self.n_readers = buf, n_readers
        self.n_chunks, self.chunk_bytes = n_chunks, chunk_bytes
        self.index = 0  # the next chunk to write

    def try_write(self, payload: bytes) -> bool:
        """Write payload into the next chunk if it is free; return False if it is not.

        Raise ValueError if the payload does not fit in a chunk.
        """
        # TODO: check the chunk is free, write length + payload, clear the read flags,
        # set the written flag, advance self.index
        raise NotImplementedError


class RingReader:
    def __init__(self, buf, reader: int, n_readers: int, n_chunks: int, chunk_bytes: int):
        self.buf, self.reader, self.n_readers = buf, reader, n_readers
        self.n_chunks, self.chunk_bytes = n_chunks, chunk_bytes
        self.index = 0  # the next chunk to read

    def try_read(self) -> bytes | None:
        """Return the next message for this reader, or None if it has not been written yet."""
        # TODO: check written flag and own read flag, copy the payload out as bytes,
        # set own read flag, advance self.index
        raise NotImplementedError


class ShmRing:
    """Owns (name=None: creates) or attaches to (name given) the segment holding a ring."""

    def __init__(self, n_readers: int, n_chunks: int, chunk_bytes: int, name: str | None = None):
        self.n_readers, self.n_chunks, self.chunk_bytes = n_readers, n_chunks, chunk_bytes
        self.is_creator = name is None
        # TODO: create a zeroed SharedMemory segment of buffer_size(...) bytes, or attach to
        # `name`; keep it in self.shm and its name in self.name
        raise NotImplementedError

    def writer(self) -> RingWriter:
        return RingWriter(self.shm.buf, self.n_readers, self.n_chunks, self.chunk_bytes)

    def reader(self, reader: int) -> RingReader:
        return RingReader(self.shm.buf, reader, self.n_readers, self.n_chunks, self.chunk_bytes)

    def close(self) -> None:
        """Unmap the segment in this process. Every process calls it once."""
        raise NotImplementedError  # TODO

    def unlink(self) -> None:
        """Remove the segment's name from /dev/shm. Only the creator calls it, once."""
        raise NotImplementedError  # TODO
