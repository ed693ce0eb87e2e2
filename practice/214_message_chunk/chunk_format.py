"""Exercise 214: packing a message's frames into one ring chunk. Read README.md in this folder.

    byte 0           0, or OVERFLOW = 1 when the frames went to the socket instead
    bytes 1..2       frame count n, u16 little-endian
    bytes 3..3+4n    the length of each frame in bytes, u32 little-endian
    then             the frames, back to back

Replace every `raise NotImplementedError` and grade with: python judge.py 214
"""

from __future__ import annotations

import struct  # noqa: F401  (struct.pack_into / unpack_from are the tools for this)

OVERFLOW = 1
HEADER_BYTES = 3  # the overflow byte and the u16 frame count
LENGTH_BYTES = 4  # one u32 length per frame
MAX_FRAMES = 0xFFFF  # the count is a u16


def packed_size(frames) -> int:
    """Bytes that pack_into needs: header, lengths and the frames themselves."""
    # TODO
    raise NotImplementedError


def fits(frames, chunk_bytes: int) -> bool:
    """Whether the frames fit a chunk of chunk_bytes bytes (an exact fit fits)."""
    # TODO
    raise NotImplementedError


def pack_into(chunk, frames) -> bool:
    """Write the frames into chunk and return True, or write only the overflow marker and
    return False."""
    # TODO
    raise NotImplementedError


def unpack(chunk) -> list[bytes] | None:
    """The frames, copied out of the chunk; None if the chunk is an overflow marker;
    ValueError if the lengths reach past the chunk's end (it was never packed, or torn)."""
    # TODO
    raise NotImplementedError
