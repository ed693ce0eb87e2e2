"""A step's batch as one contiguous buffer with a fixed header: the wire form is the batch.

`FlatBatch.build(request_ids, token_ids, block_ids)` writes the batch once into one buffer;
`encode()` hands that buffer out (nothing is serialized: the buffer already is the message);
`FlatBatch.decode(buf)` reads the header, checks it against the buffer's length, and views the
rest with one `np.frombuffer`. Nothing is copied and no Python object is made per request or
per token on either side, which is what pickle and msgpack spend their time on (chapter 04).

Layout, little-endian, every section 4-byte aligned:

    offset  bytes        what
    0       4            MAGIC b"MVFB"
    4       2            VERSION (u16)
    6       2            0 (reserved)
    8       4 x 4        B requests, T token ids, K block ids, S bytes of request ids (u32)
    24      4 (B + 1)    token_offsets: request i's tokens are token_ids[o[i]:o[i + 1]]
            4 (B + 1)    block_offsets
            4 (B + 1)    id_offsets: request i's id is ids[o[i]:o[i + 1]], UTF-8
            4 T          token_ids (int32)
            4 K          block_ids (int32)
            S            the request ids, UTF-8, back to back
    total   24 + 4 (3B + 3 + T + K) + S, exactly

`decode` raises `minivllm.serial.DecodeError` (and nothing else) for a buffer that is too
short for the header, has another magic or version, or whose length is not the one its header
gives (truncated, or trailing bytes). It checks structure, not content, as the msgpack path
does: `validate()` also checks that every offsets array starts at 0, never goes down and ends
at its section's length, for a receiver that does not trust its peer. A bad offset can only
select the wrong part of its own section (numpy slices are clamped), never other memory.

Request ids stay one UTF-8 section: `request_id(i)` decodes one, `request_ids` all of them,
when asked. The arrays are views of the buffer: read-only when it is (bytes), and they keep it
alive. vLLM has no such message; its step (SchedulerOutput) is pickled Python objects
(vllm/v1/core/sched/output.py, sent by vllm/v1/executor/multiproc_executor.py).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np

from minivllm.serial import DecodeError

MAGIC = b"MVFB"
VERSION = 1
HEADER = struct.Struct("<4sHHIIII")  # magic, version, reserved, B, T, K, S
_I32 = np.dtype("<i4")
_unpack_header = HEADER.unpack_from


class FlatBatch(msgspec.Struct, gc=False):
    """A decoded (or built) batch: views of one buffer, sliced on access. A Struct, not a
    class with __init__: building one is a third of the cost of decode at batch 32."""

    buffer: Any  # bytes, bytearray or memoryview: the whole message
    num_reqs: int
    num_tokens: int
    num_blocks: int
    ints: np.ndarray  # int32: the three offsets arrays, token_ids, block_ids, back to back

    # --- the wire ---------------------------------------------------------------------------
    @classmethod
    def build(cls, request_ids: Sequence[str], token_ids: Sequence, block_ids: Sequence
              ) -> FlatBatch:
        """Write the batch into a new buffer: one row of token ids and of block ids per
        request (lists or int arrays). This is where the cost is: encode() is free after it."""
        if not len(request_ids) == len(token_ids) == len(block_ids):
            raise ValueError(f"{len(request_ids)} request ids, {len(token_ids)} token rows and "
                             f"{len(block_ids)} block rows: one of each per request")
        ids = [r.encode() for r in request_ids]
        b = len(ids)
        tok_n = np.fromiter(map(len, token_ids), np.int64, b)
        blk_n = np.fromiter(map(len, block_ids), np.int64, b)
        t, k, s = int(tok_n.sum()), int(blk_n.sum()), sum(map(len, ids))
        n_ints = 3 * b + 3 + t + k
        buf = bytearray(HEADER.size + 4 * n_ints + s)
        HEADER.pack_into(buf, 0, MAGIC, VERSION, 0, b, t, k, s)
        ints = np.frombuffer(buf, _I32, n_ints, HEADER.size)
        for start, counts in ((0, tok_n), (b + 1, blk_n), (2 * b + 2, map(len, ids))):
            ints[start] = 0
            np.cumsum(np.fromiter(counts, np.int64, b), out=ints[start + 1:start + b + 1])
        base = 3 * b + 3
        if t:
            ints[base:base + t] = np.concatenate([np.asarray(x, _I32) for x in token_ids])
        if k:
            ints[base + t:base + t + k] = np.concatenate([np.asarray(x, _I32) for x in block_ids])
        buf[HEADER.size + 4 * n_ints:] = b"".join(ids)
        return cls(buf, b, t, k, ints)

    def encode(self):
        """The message: the buffer itself (send it as one frame; keep the batch until sent)."""
        return self.buffer

    @classmethod
    def decode(cls, buf) -> FlatBatch:
        """View a received buffer (bytes, bytearray, memoryview); DecodeError if it is not one
        whole FlatBatch of this version."""
        if type(buf) is not bytes and type(buf) is not bytearray:
            buf = _byte_view(buf)  # len() is then its size in bytes
        try:
            magic, version, _, b, t, k, s = _unpack_header(buf)
        except struct.error:
            raise DecodeError(f"not a FlatBatch: {len(buf)} bytes, the header alone is "
                              f"{HEADER.size}") from None
        if magic != MAGIC:
            raise DecodeError(f"not a FlatBatch: magic {bytes(magic)!r}, expected {MAGIC!r}")
        if version != VERSION:
            raise DecodeError(f"FlatBatch version {version}, this reader knows {VERSION}")
        n_ints = 3 * b + 3 + t + k
        end = HEADER.size + 4 * n_ints
        if len(buf) != end + s:
            raise DecodeError(
                f"FlatBatch of {len(buf)} bytes, its header says {end + s} ({b} requests, "
                f"{t} token ids, {k} block ids, {s} id bytes): "
                + ("truncated" if len(buf) < end + s else "trailing bytes"))
        return cls(buf, b, t, k, np.frombuffer(buf, _I32, n_ints, HEADER.size))

    # --- the batch ----------------------------------------------------------------------------
    @property
    def token_offsets(self) -> np.ndarray:
        return self.ints[:self.num_reqs + 1]

    @property
    def block_offsets(self) -> np.ndarray:
        return self.ints[self.num_reqs + 1:2 * self.num_reqs + 2]

    @property
    def token_ids(self) -> np.ndarray:
        base = 3 * self.num_reqs + 3
        return self.ints[base:base + self.num_tokens]

    @property
    def block_ids(self) -> np.ndarray:
        base = 3 * self.num_reqs + 3 + self.num_tokens
        return self.ints[base:base + self.num_blocks]

    def tokens_of(self, i: int) -> np.ndarray:
        o = self.token_offsets
        return self.token_ids[o[i]:o[i + 1]]

    def blocks_of(self, i: int) -> np.ndarray:
        o = self.block_offsets
        return self.block_ids[o[i]:o[i + 1]]

    @property
    def id_bytes(self) -> memoryview:
        """The request ids' section: UTF-8, back to back."""
        return memoryview(self.buffer)[HEADER.size + 4 * len(self.ints):]

    def request_id(self, i: int) -> str:
        a, z = self.ints[2 * self.num_reqs + 2 + i:2 * self.num_reqs + 4 + i].tolist()
        return _utf8(self.id_bytes[a:z])

    @property
    def request_ids(self) -> list[str]:
        """Every request id (decoded now: one str per request)."""
        o = self.ints[2 * self.num_reqs + 2:3 * self.num_reqs + 3].tolist()
        ids = bytes(self.id_bytes)
        return [_utf8(ids[a:z]) for a, z in zip(o, o[1:])]

    def validate(self) -> FlatBatch:
        """Check every offsets array (starts at 0, never goes down, ends at its section's
        length) and that the ids are UTF-8; DecodeError naming the first that is not. Returns
        self."""
        b = self.num_reqs
        for name, start, total in (("token_offsets", 0, self.num_tokens),
                                   ("block_offsets", b + 1, self.num_blocks),
                                   ("id_offsets", 2 * b + 2, len(self.id_bytes))):
            o = self.ints[start:start + b + 1]
            if o[0] != 0 or o[-1] != total or (b and (np.diff(o) < 0).any()):
                raise DecodeError(f"FlatBatch {name} {o[:8].tolist()}... must start at 0, "
                                  f"never go down and end at {total}")
        self.request_ids  # each id alone: a cut inside a character is not UTF-8 either
        return self


def _byte_view(buf) -> memoryview:
    """A flat memoryview of bytes of any buffer (a zmq.Frame, an int32 view...)."""
    try:
        view = memoryview(buf)
    except TypeError:
        raise DecodeError(f"not a FlatBatch: a {type(buf).__qualname__}, not a buffer") from None
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def _utf8(data) -> str:
    try:
        return str(data, "utf-8")
    except UnicodeDecodeError as e:
        raise DecodeError(f"FlatBatch request ids are not UTF-8: {e}") from None
