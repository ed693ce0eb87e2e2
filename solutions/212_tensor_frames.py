"""Exercise 212, reference answer: numpy arrays as msgpack ext values, large ones out of band."""

from __future__ import annotations

import math
from typing import Any

import msgspec
import numpy as np

THRESHOLD = 256  # bytes; below this an extra frame costs more than copying the bytes inline
EXT_INLINE = 1  # payload: u16 LE header length | header | raw bytes
EXT_OOB = 2  # payload: msgpack [dtype, shape, frame index]
KINDS = "biufc"  # bool, ints, floats, complex: dtypes whose raw bytes mean the same elsewhere


class DecodeError(ValueError):  # pragma: no mutate block
    """The frames are not a valid message: the only error TensorDecoder.decode raises."""


class TensorEncoder:
    def __init__(self, threshold: int = THRESHOLD):  # pragma: no mutate block
        self.threshold = threshold
        self._encoder = msgspec.msgpack.Encoder(enc_hook=self._enc_hook)
        self._frames: list = []

    def encode(self, obj: Any) -> list[bytes | memoryview]:
        """[msgpack body, out-of-band buffer 1, ...], ready for send_multipart."""
        self._frames = [b""]
        self._frames[0] = self._encoder.encode(obj)
        frames, self._frames = self._frames, []
        return frames

    def _enc_hook(self, obj: Any) -> Any:
        if not isinstance(obj, np.ndarray) or obj.dtype.kind not in KINDS:
            raise TypeError(f"cannot encode {type(obj).__name__}")
        arr = np.ascontiguousarray(obj)  # C order; copies only when obj is not contiguous
        raw = np.frombuffer(arr, np.uint8)  # the array's own memory, as bytes: no copy
        header = [obj.dtype.str, list(obj.shape)]
        if raw.nbytes < self.threshold:
            head = msgspec.msgpack.encode(header)
            return msgspec.msgpack.Ext(EXT_INLINE, len(head).to_bytes(2, "little") + head + raw.data)
        self._frames.append(raw.data)
        return msgspec.msgpack.Ext(EXT_OOB, msgspec.msgpack.encode(header + [len(self._frames) - 1]))


class TensorDecoder:
    def __init__(self):  # pragma: no mutate block
        self._decoder = msgspec.msgpack.Decoder(ext_hook=self._ext_hook)
        self._frames: list = []

    def decode(self, frames: list) -> Any:
        """Rebuild the object; large arrays view their frame. Raises DecodeError only."""
        self._frames = list(frames)
        try:
            return self._decoder.decode(self._frames[0])
        except Exception as e:  # garbage can fail anywhere: the caller gets one error type
            raise DecodeError(f"not a valid message: {e}") from e
        finally:
            self._frames = []

    def _ext_hook(self, code: int, data: memoryview) -> Any:
        if code == EXT_INLINE:
            n = int.from_bytes(data[:2], "little")
            dtype, shape = msgspec.msgpack.decode(data[2:2 + n])
            raw = data[2 + n:]
        elif code == EXT_OOB:
            dtype, shape, index = msgspec.msgpack.decode(data)
            if not isinstance(index, int) or not 0 < index < len(self._frames):
                raise DecodeError(f"frame index {index!r} out of range")
            raw = memoryview(self._frames[index])
        else:
            raise DecodeError(f"unknown ext code {code}")
        return _array(raw, dtype, shape)


def _array(raw: memoryview, dtype: Any, shape: Any) -> np.ndarray:
    dt = np.dtype(dtype)
    if dt.kind not in KINDS or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise DecodeError(f"bad header {dtype!r} {shape!r}")
    if math.prod(shape) * dt.itemsize != raw.nbytes:
        raise DecodeError(f"shape {shape} of {dtype} does not fit {raw.nbytes} bytes")
    return np.frombuffer(raw, dtype=dt).reshape(shape)  # a view of the frame: no copy
