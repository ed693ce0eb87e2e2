"""Exercise 214, reference solution: packing a message's frames into one ring chunk.

    byte 0           0, or OVERFLOW = 1 when the frames went to the socket instead
    bytes 1..2       frame count n, u16 little-endian
    bytes 3..3+4n    the length of each frame in bytes, u32 little-endian
    then             the frames, back to back
"""

from __future__ import annotations

import struct

OVERFLOW = 1
HEADER = struct.Struct("<BH")  # overflow byte, frame count
HEADER_BYTES = 3  # the overflow byte and the u16 frame count  # pragma: no mutate
LENGTH_BYTES = 4
MAX_FRAMES = 0xFFFF  # the count is a u16


def _bytes(frame) -> memoryview:
    view = memoryview(frame)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def packed_size(frames) -> int:
    return HEADER.size + LENGTH_BYTES * len(frames) + sum(memoryview(f).nbytes for f in frames)


def fits(frames, chunk_bytes: int) -> bool:
    return len(frames) <= MAX_FRAMES and packed_size(frames) <= chunk_bytes


def pack_into(chunk, frames) -> bool:
    """Write the frames into chunk and return True, or write only the overflow marker."""
    if not fits(frames, len(chunk)):
        chunk[0] = OVERFLOW
        return False
    views = [_bytes(f) for f in frames]
    HEADER.pack_into(chunk, 0, 0, len(views))
    struct.pack_into(f"<{len(views)}I", chunk, HEADER.size, *(v.nbytes for v in views))
    offset = HEADER.size + LENGTH_BYTES * len(views)
    for v in views:
        chunk[offset:offset + v.nbytes] = v
        offset += v.nbytes
    return True


def unpack(chunk) -> list[bytes] | None:
    """The frames, copied out of the chunk; None if the chunk is an overflow marker;
    ValueError if the lengths reach past the chunk's end (it was never packed, or torn)."""
    overflow, count = HEADER.unpack_from(chunk, 0)
    if overflow:
        return None
    offset = HEADER.size + LENGTH_BYTES * count
    if offset > memoryview(chunk).nbytes:  # a torn count: struct would raise struct.error
        raise ValueError(f"{count} frame lengths reach past the end of this "
                         f"{memoryview(chunk).nbytes}-byte chunk")
    lengths = struct.unpack_from(f"<{count}I", chunk, HEADER.size)  # unsigned: up to 4 GiB
    if offset + sum(lengths) > memoryview(chunk).nbytes:
        raise ValueError(f"frame lengths {list(lengths)} reach past the end of this "
                         f"{memoryview(chunk).nbytes}-byte chunk")
    frames = []
    for n in lengths:
        frames.append(bytes(chunk[offset:offset + n]))  # a copy: the chunk will be reused
        offset += n
    return frames
