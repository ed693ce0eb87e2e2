"""Exercise 211, reference answer: one int32 frame for all token ids of a batch."""

from __future__ import annotations

import msgspec
import numpy as np


def encode(batch: list[tuple[str, list[int]]]) -> list[bytes | memoryview]:
    """[msgpack([request_ids, offsets]), int32 token ids of every request, concatenated]."""
    ids = [rid for rid, _ in batch]
    lengths = [len(tokens) for _, tokens in batch]
    offsets = [0] + np.cumsum(lengths, dtype=np.int64).tolist()
    flat = np.fromiter((t for _, tokens in batch for t in tokens), dtype="<i4",
                       count=offsets[-1])
    return [msgspec.msgpack.encode([ids, offsets]), flat.data]


def decode(frames) -> tuple[list[str], np.ndarray, list[int]]:
    """(request_ids, tokens viewing frame 1, offsets)."""
    ids, offsets = msgspec.msgpack.decode(frames[0])
    if len(offsets) != len(ids) + 1:
        raise ValueError(f"frame 0 has {len(offsets)} offsets for {len(ids)} requests; "
                         "expected len(request_ids) + 1")
    size = memoryview(frames[1]).nbytes
    if size != 4 * offsets[-1]:
        raise ValueError(f"frame 1 has {size} bytes but offsets[-1] = {offsets[-1]} tokens "
                         f"need {4 * offsets[-1]}: the frames do not belong together")
    tokens = np.frombuffer(frames[1], dtype="<i4")  # a view: no copy
    return ids, tokens, offsets


def tokens_of(decoded: tuple[list[str], np.ndarray, list[int]], i: int) -> np.ndarray:
    """Request i's token ids: a slice of the tokens array."""
    _, tokens, offsets = decoded
    return tokens[offsets[i]:offsets[i + 1]]
