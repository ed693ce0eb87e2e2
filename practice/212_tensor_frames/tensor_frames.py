"""Exercise 212: numpy arrays as msgpack ext values, large ones out of band (see README.md)."""

from __future__ import annotations

import math  # noqa: F401  (math.prod is handy for the size check)
from typing import Any

import msgspec
import numpy as np

THRESHOLD = 256  # bytes; below this an extra frame costs more than copying the bytes inline
EXT_INLINE = 1  # payload: u16 LE header length | header | raw bytes
EXT_OOB = 2  # payload: msgpack [dtype, shape, frame index]
KINDS = "biufc"  # bool, ints, floats, complex: dtypes whose raw bytes mean the same elsewhere


class DecodeError(ValueError):
    """The frames are not a valid message: the only error TensorDecoder.decode raises."""


class TensorEncoder:
    def __init__(self, threshold: int = THRESHOLD):
        self.threshold = threshold
        self._encoder = msgspec.msgpack.Encoder(enc_hook=self._enc_hook)
        self._frames: list = []

    def encode(self, obj: Any) -> list[bytes | memoryview]:
        """[msgpack body, out-of-band buffer 1, ...], ready for send_multipart."""
        raise NotImplementedError("TODO: reset self._frames, encode obj into frame 0, return them")

    def _enc_hook(self, obj: Any) -> Any:
        """msgspec calls this for each object it cannot encode itself: return an Ext."""
        raise NotImplementedError("TODO: array -> Ext(EXT_INLINE, ...) or a new frame + "
                                  "Ext(EXT_OOB, ...); anything else -> TypeError")


class TensorDecoder:
    def __init__(self):
        self._decoder = msgspec.msgpack.Decoder(ext_hook=self._ext_hook)
        self._frames: list = []

    def decode(self, frames: list) -> Any:
        """Rebuild the object; large arrays view their frame. Raises DecodeError only."""
        raise NotImplementedError("TODO: keep the frames, decode frame 0, turn any error "
                                  "into DecodeError")

    def _ext_hook(self, code: int, data: memoryview) -> Any:
        """msgspec calls this for each ext value: return the array it stands for."""
        raise NotImplementedError("TODO: parse the header, check it, np.frombuffer(...).reshape")
