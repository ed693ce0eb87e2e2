"""How MessageQueue lays one message out in one ring chunk (exercise 214 builds the same).

A message is MsgpackEncoder's frames (minivllm/serial.py): the msgpack body, then the raw
buffers of large arrays. In a chunk:

    byte 0           0, or OVERFLOW = 1: the frames went to the XPUB socket instead
    bytes 1..2       frame count n, u16 little-endian
    bytes 3..3+4n    the length of each frame in bytes, u32 little-endian
    then             the frames, back to back

An overflowed chunk carries only byte 0, which keeps the message's place in the order.
vLLM's format is the same idea with big-endian lengths around pickle buffers:
vllm/distributed/device_communicators/shm_broadcast.py:960-973 (0.33.0).
"""

from __future__ import annotations

import functools
import struct

OVERFLOW = 1
MAX_FRAMES = 0xFFFF  # the count is a u16
_COUNT = struct.Struct("<BH")  # overflow byte, frame count
LENGTH_BYTES = 4


def packed_size(sizes: list[int]) -> int:
    """Bytes a message with frames of these sizes takes in a chunk."""
    return _COUNT.size + LENGTH_BYTES * len(sizes) + sum(sizes)


def pack_into(chunk: memoryview, frames: list[memoryview], sizes: list[int]) -> bool:
    """Write the frames into chunk and return True; or write only OVERFLOW and return False."""
    n = len(frames)
    if n > MAX_FRAMES or packed_size(sizes) > len(chunk):
        chunk[0] = OVERFLOW
        return False
    _header(n).pack_into(chunk, 0, 0, n, *sizes)
    offset = _COUNT.size + LENGTH_BYTES * n
    for f, size in zip(frames, sizes):
        chunk[offset:offset + size] = f
        offset += size
    return True


def unpack_from(buf: memoryview, start: int) -> list[memoryview] | None:
    """The frames of the chunk at buf[start:], copied out in one piece; None for OVERFLOW.

    A copy, because the writer reuses the chunk as soon as the reader releases it, and the
    decoder's arrays are views of the frames they come from.
    """
    overflow, count = _COUNT.unpack_from(buf, start)
    if overflow:
        return None
    lengths = _lengths(count).unpack_from(buf, start + _COUNT.size)
    begin = start + _COUNT.size + LENGTH_BYTES * count
    data = memoryview(bytearray(buf[begin:begin + sum(lengths)]))
    frames, offset = [], 0
    for n in lengths:
        frames.append(data[offset:offset + n])
        offset += n
    return frames


@functools.lru_cache(maxsize=64)
def _header(n: int) -> struct.Struct:
    """The overflow byte, the u16 count and n u32 lengths: one pack_into per message."""
    return struct.Struct(f"<BH{n}I")


@functools.lru_cache(maxsize=64)
def _lengths(n: int) -> struct.Struct:
    return struct.Struct(f"<{n}I")
