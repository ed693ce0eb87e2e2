"""Exercise 211: one int32 frame for all token ids of a batch (see README.md)."""

from __future__ import annotations

import msgspec
import numpy as np


def encode(batch: list[tuple[str, list[int]]]) -> list[bytes | memoryview]:
    """[msgpack([request_ids, offsets]), int32 token ids of every request, concatenated]."""
    raise NotImplementedError("TODO: build request_ids, offsets and one int32 array")


def decode(frames) -> tuple[list[str], np.ndarray, list[int]]:
    """(request_ids, tokens viewing frame 1, offsets)."""
    raise NotImplementedError("TODO: msgspec.msgpack.decode frame 0, np.frombuffer frame 1")


def tokens_of(decoded: tuple[list[str], np.ndarray, list[int]], i: int) -> np.ndarray:
    """Request i's token ids: a slice of the tokens array."""
    raise NotImplementedError("TODO: slice with the offsets")
