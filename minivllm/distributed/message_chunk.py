"""How MessageQueue lays one message out in one ring chunk (exercise 214 builds the same).

A message is MsgpackEncoder's frames (minivllm/serial.py): the msgpack body, then the raw
buffers of large arrays. In a chunk:

    byte 0           0, or OVERFLOW = 1: the frames went to the XPUB socket instead
    bytes 1..2       frame count n, u16 little-endian
    bytes 3..3+4n    the length of each frame in bytes, u32 little-endian
    then             the frames, back to back

An overflowed chunk carries only byte 0, which keeps the message's place in the order.
vLLM's format is the same idea with big-endian lengths around pickle buffers:
vllm/distributed/device_communicators/shm_broadcast.py (MessageQueue.enqueue).
"""

from __future__ import annotations

import functools
import struct
from typing import Any, Callable

OVERFLOW = 1
OVERFLOWED = object()  # decode_from(): this chunk's message is on the overflow socket
MAX_FRAMES = 0xFFFF  # the count is a u16
_COUNT = struct.Struct("<BH")  # overflow byte, frame count
LENGTH_BYTES = 4
# The common message is the msgpack body alone (no array is large enough to go out of band):
# its whole header in one struct, packed and unpacked in one call.
_ONE_FRAME = struct.Struct("<BHI")
_ONE_SIZE, _pack_one, _unpack_one = _ONE_FRAME.size, _ONE_FRAME.pack_into, _ONE_FRAME.unpack_from


def packed_size(sizes: list[int]) -> int:
    """Bytes a message with frames of these sizes takes in a chunk."""
    return _COUNT.size + LENGTH_BYTES * len(sizes) + sum(sizes)


def pack_into(buf: memoryview, start: int, size: int, frames: list) -> bool:
    """Write the frames into buf[start:start + size] and return True; or write only OVERFLOW
    there and return False. Frames are bytes or buffers (MsgpackEncoder's output)."""
    if len(frames) == 1 and (type(body := frames[0]) is bytearray or type(body) is bytes):
        n = len(body)
        if _ONE_SIZE + n > size:
            buf[start] = OVERFLOW
            return False
        _pack_one(buf, start, 0, 1, n)
        begin = start + _ONE_SIZE
        buf[begin:begin + n] = body
        return True
    views = [_bytes_view(f) for f in frames]
    sizes = [v.nbytes for v in views]
    n = len(views)
    if n > MAX_FRAMES or packed_size(sizes) > size:
        buf[start] = OVERFLOW
        return False
    _header(n).pack_into(buf, start, 0, n, *sizes)
    offset = start + _COUNT.size + LENGTH_BYTES * n
    for v, nbytes in zip(views, sizes):
        buf[offset:offset + nbytes] = v
        offset += nbytes
    return True


def unpack_from(buf: memoryview, start: int) -> list | None:
    """The frames of the chunk at buf[start:], copied out; None for OVERFLOW.

    A copy, because the writer reuses the chunk as soon as the reader releases it, and the
    decoder's arrays are views of the frames they come from (inline arrays too: msgspec hands
    the ext hook a view of the body). One frame: one bytes object. Several: one bytearray,
    sliced into views.
    """
    overflow, count, first = _ONE_FRAME.unpack_from(buf, start)
    if overflow:
        return None
    if count == 1:
        begin = start + _ONE_FRAME.size
        return [bytes(buf[begin:begin + first])]
    lengths = _lengths(count).unpack_from(buf, start + _COUNT.size)
    begin = start + _COUNT.size + LENGTH_BYTES * count
    data = memoryview(bytearray(buf[begin:begin + sum(lengths)]))
    frames, offset = [], 0
    for n in lengths:
        frames.append(data[offset:offset + n])
        offset += n
    return frames


def decode_from(decoder: Any) -> Callable[[memoryview, int], Any]:
    """A reader of chunks for ShmRingBuffer.read: decode(buf, start) is the message in the chunk
    at buf[start:], decoded by decoder (a MsgpackDecoder) while the chunk is held, or OVERFLOWED
    if its frames went to the socket. The common one-frame message is decoded in place, without
    copying the body out first, as vLLM unpickles straight from the ring
    (vLLM: MessageQueue.dequeue). The result refers to none of buf."""
    borrowed, decode_frames = decoder.decode_borrowed, decoder.decode  # bound once: per message

    def decode(buf: memoryview, start: int) -> Any:
        overflow, count, first = _unpack_one(buf, start)
        if overflow:
            return OVERFLOWED
        if count == 1:
            begin = start + _ONE_SIZE
            return borrowed(buf[begin:begin + first])
        return decode_frames(unpack_from(buf, start))

    return decode


def _bytes_view(frame) -> memoryview:
    view = memoryview(frame)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


@functools.lru_cache(maxsize=64)
def _header(n: int) -> struct.Struct:
    """The overflow byte, the u16 count and n u32 lengths: one pack_into per message."""
    return struct.Struct(f"<BH{n}I")


@functools.lru_cache(maxsize=64)
def _lengths(n: int) -> struct.Struct:
    return struct.Struct(f"<{n}I")
