"""Messages to frames and back: msgpack for the structure, raw frames for the arrays.

`MsgpackEncoder.encode(obj)` returns a list of frames, ready for `socket.send_multipart`:

    frame 0      the msgpack body: the object, with every array replaced by an ext value
    frame 1..n   out-of-band buffers: the raw memory of each array or tensor of at least
                 `size_threshold` bytes, as a zero-copy memoryview (nothing is copied here)

An array or tensor becomes one msgpack ext value (code, payload):

    code  what                       payload
    1     numpy array, inline         u16 LE header length | header | raw bytes
    2     numpy array, out of band    header + [frame index]
    3     torch tensor, inline        u16 LE header length | header | raw bytes
    4     torch tensor, out of band   header + [frame index]
    5     pickle (opt-in only)        pickle bytes
    6     numpy array, shared memory  header + [slot, nbytes]   (an encoder given an arena)
    7     torch tensor, shared memory header + [slot, nbytes]

where header is the msgpack array [dtype, shape] (numpy dtype string such as "<i4", or a
torch dtype name such as "bfloat16"). Small arrays go inline because a frame costs more
than copying a few hundred bytes; large ones go out of band so that nobody copies them.
An encoder given a ShmTensorArena (distributed/shm_tensor_arena.py) copies arrays of at least
its min_bytes once into a shared slot instead, and the decoder given the same arena returns a
read-only view of the slot: for big tensors between processes of one machine.

`MsgpackDecoder(t).decode(frames)` rebuilds the object, validated against type t when
given. Arrays come back as `np.frombuffer` views of the frame memory, not copies: they are
read-only when the frame is, and they keep the frame alive. Anything that is not a valid
message raises `DecodeError`, and nothing else. A header is bounded (MAX_HEADER_BYTES,
MAX_DIMS) before it is decoded, and shape x itemsize must match the data before an array is
built, so a small message cannot make the decoder build something big. A field annotated with
`Int32Array` accepts only a 1-D int32 array in native byte order (token ids).

pickle runs arbitrary code on the receiver, so an object that msgpack cannot express is a
`TypeError` unless MINIVLLM_ALLOW_INSECURE_SERIALIZATION=1 (chapter 04).
In vLLM: vllm/v1/serial_utils.py, MsgpackEncoder (its _encode_ndarray: inline or an index into
the extra buffers; its enc_hook: the pickle refusal) and MsgpackDecoder (its _decode_ndarray:
np.frombuffer, no copy). vLLM sends an array as a (dtype, shape, data) tuple
that only a typed decoder rebuilds; here an array is one ext value, so untyped decoding
rebuilds it too.
Encoder and decoder keep per-call state: use one of each per thread.
"""

from __future__ import annotations

import functools
import math
import os
import pickle
import re
import sys
import warnings
from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np
import zmq
from msgspec import msgpack

ZERO_COPY_THRESHOLD = 256  # bytes; below this a separate frame costs more than a copy
INSECURE_ENV = "MINIVLLM_ALLOW_INSECURE_SERIALIZATION"

EXT_NDARRAY_INLINE = 1
EXT_NDARRAY_OOB = 2
EXT_TENSOR_INLINE = 3
EXT_TENSOR_OOB = 4
EXT_PICKLE = 5
EXT_NDARRAY_SHM = 6
EXT_TENSOR_SHM = 7

# numpy dtype kinds we rebuild from raw bytes: bool, ints, floats, complex. Never "O"
# (object pointers) or "V" (void), whose bytes mean nothing in another process.
_RAW_KINDS = frozenset("biufc")
_RAW_DTYPE = re.compile(r"[<>|][biufc][0-9]{1,2}")  # the dtype.str of those kinds: "<i4", "|b1"
_HEADER_LEN = 2  # u16 little-endian length of the inline header
MAX_DIMS = 64  # numpy's limit; a header claiming more is garbage
# [dtype, shape, index] with MAX_DIMS dimensions of up to 9 msgpack bytes each fits in this.
MAX_HEADER_BYTES = 1024

Frame = bytes | bytearray | memoryview | zmq.Frame
_BORROWED = (b"",)  # MsgpackDecoder._frames during decode_borrowed(): one frame, not kept


class DecodeError(ValueError):
    """The frames are not a valid message: the one error `MsgpackDecoder.decode` raises."""


def insecure_allowed() -> bool:
    """True when the user opted in to pickle on the wire (read on every call)."""
    return os.environ.get(INSECURE_ENV, "") == "1"


def _tensor_type() -> type | None:
    # torch is heavy to import; a process that never imported it cannot hold a tensor.
    torch = sys.modules.get("torch")
    return torch.Tensor if torch is not None else None


class _ArrayRule(type):
    """isinstance(x, Int32Array) is the rule itself: msgspec checks what dec_hook returns with
    isinstance, and a plain ndarray that follows the rule passes."""

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, np.ndarray) and obj.dtype == cls.wire_dtype and obj.ndim == cls.wire_ndim


class Int32Array(np.ndarray, metaclass=_ArrayRule):
    """Annotation of a Struct field that must hold a 1-D int32 array in native byte order
    (token ids): a typed MsgpackDecoder rejects float, bool, 2-D, 0-d or big-endian arrays
    there. Values stay plain numpy arrays; this class only names the rule."""

    wire_dtype = np.dtype(np.int32)  # native byte order: ">i4" is a different dtype
    wire_ndim = 1


class MsgpackEncoder:
    """Encode an object into [msgpack body, out-of-band buffer, ...] without copying arrays."""

    def __init__(self, size_threshold: int = ZERO_COPY_THRESHOLD, arena: Any = None):
        self.size_threshold, self.arena = size_threshold, arena  # arena: a ShmTensorArena
        self._encoder = msgpack.Encoder(enc_hook=self._enc_hook)
        self._frames: list[bytes | memoryview] | None = None

    def encode(self, obj: Any) -> list[bytes | memoryview]:
        """Frame 0 is the body; frames 1.. view the memory of large arrays (keep them alive
        until sent)."""
        self._frames = frames = [b""]
        try:
            frames[0] = self._encoder.encode(obj)
            return frames
        finally:
            self._frames = None

    def encode_into(self, obj: Any, buf: bytearray) -> list[bytearray | memoryview]:
        """encode(), with the body written into `buf` (resized as needed): a sender that reuses
        one buffer allocates no new body per message. Frame 0 is `buf` itself."""
        self._frames = frames = [buf]
        try:
            self._encoder.encode_into(obj, buf)
            return frames
        finally:
            self._frames = None

    def _enc_hook(self, obj: Any) -> Any:
        if isinstance(obj, np.ndarray) and obj.dtype.kind in _RAW_KINDS:
            raw = np.ascontiguousarray(obj).reshape(-1).view(np.uint8)
            return self._ext(EXT_NDARRAY_INLINE, obj.dtype.str, obj.shape, raw.data)
        tensor = _tensor_type()
        if tensor is not None and isinstance(obj, tensor):
            return self._encode_tensor(obj)
        if not insecure_allowed():
            raise TypeError(
                f"cannot send a {type(obj).__qualname__} on the wire: use msgspec Structs, "
                f"builtins, numpy arrays or tensors, or set {INSECURE_ENV}=1 to allow pickle "
                "(only between processes you trust: unpickling runs arbitrary code)")
        return msgpack.Ext(EXT_PICKLE, pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))

    def _encode_tensor(self, t: Any) -> msgpack.Ext:
        import torch

        t = t.detach()
        if t.device.type != "cpu":
            t = t.cpu()  # the wire carries host memory; CUDA IPC is chapter 06
        flat = t.contiguous().reshape(-1).view(torch.uint8)
        dtype = str(t.dtype).removeprefix("torch.")
        return self._ext(EXT_TENSOR_INLINE, dtype, tuple(t.shape), flat.numpy().data)

    def _ext(self, inline_code: int, dtype: str, shape: tuple, raw: memoryview) -> msgpack.Ext:
        assert self._frames is not None, "enc_hook runs only inside encode()"
        if raw.nbytes < self.size_threshold:
            header = msgpack.encode((dtype, shape))
            payload = len(header).to_bytes(_HEADER_LEN, "little") + header + raw
            return msgpack.Ext(inline_code, payload)
        if self.arena is not None and (slot := self.arena.put(raw)) is not None:
            code = EXT_NDARRAY_SHM if inline_code == EXT_NDARRAY_INLINE else EXT_TENSOR_SHM
            return msgpack.Ext(code, msgpack.encode((dtype, shape, slot, raw.nbytes)))
        self._frames.append(raw)
        return msgpack.Ext(inline_code + 1, msgpack.encode((dtype, shape, len(self._frames) - 1)))


class MsgpackDecoder:
    """Decode frames from `MsgpackEncoder`, optionally into type t (a Struct, a union...)."""

    def __init__(self, t: type | None = None, arena: Any = None):
        args = () if t is None else (t,)
        self.arena = arena  # the ShmTensorArena (attached as a reader) that shm handles name
        self._decoder = msgpack.Decoder(*args, ext_hook=self._ext_hook, dec_hook=self._dec_hook)
        self._inline_header = msgpack.Decoder(tuple[str, tuple[int, ...]])
        self._oob_header = msgpack.Decoder(tuple[str, tuple[int, ...], int])
        self._shm_header = msgpack.Decoder(tuple[str, tuple[int, ...], int, int])
        self._frames: Sequence[Any] = ()

    def decode(self, frames: Sequence[Frame] | Frame) -> Any:
        """Rebuild the object; raise DecodeError (only) if the frames are not a message."""
        if isinstance(frames, (bytes, bytearray, memoryview, zmq.Frame)):
            frames = [frames]
        elif not isinstance(frames, (list, tuple)):
            raise DecodeError(f"expected a frame or a list of frames, got {type(frames).__qualname__}")
        self._frames = frames
        try:
            if len(frames) == 0:
                raise DecodeError("no frames: a message has at least its msgpack body")
            body = frames[0]  # bytes as they are: the common case from a ring or a copy
            return self._decoder.decode(body if type(body) is bytes else _buffer(body))
        except DecodeError:
            raise
        except Exception as e:  # garbage can fail anywhere; the caller gets one error type
            raise DecodeError(f"not a valid message ({len(frames)} frames): {e}") from e
        finally:
            self._frames = ()

    def decode_borrowed(self, body: memoryview) -> Any:
        """decode() of a one-frame message in memory the caller reuses as soon as this returns
        (a ring chunk): the result refers to none of it, as inline arrays are copied out. One
        copy fewer than decode(bytes(body)): msgspec copies strings and bytes out anyway."""
        self._frames = _BORROWED
        try:
            return self._decoder.decode(body)
        except DecodeError:
            raise
        except Exception as e:
            raise DecodeError(f"not a valid message (1 frame): {e}") from e
        finally:
            self._frames = ()

    def _dec_hook(self, t: type, obj: Any) -> Any:
        # The ext hook already built arrays and tensors; here we only check the type.
        if t is object or isinstance(obj, t):
            return obj
        if type(t) is _ArrayRule:
            got = (f"a {obj.dtype.str} array of {obj.ndim} dimensions"
                   if isinstance(obj, np.ndarray) else type(obj).__qualname__)
            raise TypeError(f"expected a {t.wire_ndim}-D {t.wire_dtype.name} array in native "
                            f"byte order, got {got}")
        raise TypeError(f"expected {t.__qualname__}, got {type(obj).__qualname__}")

    def _ext_hook(self, code: int, data: memoryview) -> Any:
        if code in (EXT_NDARRAY_INLINE, EXT_TENSOR_INLINE):
            n = int.from_bytes(data[:_HEADER_LEN], "little")
            _check_header(n)
            dtype, shape = self._inline_header.decode(data[_HEADER_LEN:_HEADER_LEN + n])
            raw = data[_HEADER_LEN + n:]
            if self._frames is _BORROWED:
                raw = memoryview(bytes(raw))  # read-only, as a view of a bytes frame is
        elif code in (EXT_NDARRAY_OOB, EXT_TENSOR_OOB):
            _check_header(len(data))
            dtype, shape, index = self._oob_header.decode(data)
            if not 0 < index < len(self._frames):
                raise DecodeError(f"array refers to frame {index}, message has {len(self._frames)}")
            raw = _buffer(self._frames[index])
        elif code in (EXT_NDARRAY_SHM, EXT_TENSOR_SHM):
            if self.arena is None:
                raise DecodeError("a shared-memory array, but this decoder has no arena")
            _check_header(len(data))
            dtype, shape, slot, nbytes = self._shm_header.decode(data)
            try:
                raw = memoryview(self.arena.view(slot, nbytes))
            except ValueError as e:
                raise DecodeError(str(e)) from None
        elif code == EXT_PICKLE:
            if not insecure_allowed():
                raise DecodeError(f"refusing a pickled object: set {INSECURE_ENV}=1 to accept "
                                  "pickle, only from peers you trust")
            return pickle.loads(data)
        else:
            raise DecodeError(f"unknown msgpack ext code {code}")
        if code in (EXT_NDARRAY_INLINE, EXT_NDARRAY_OOB, EXT_NDARRAY_SHM):
            return _ndarray_from(raw, dtype, shape)
        return _tensor_from(raw, dtype, shape)


def _buffer(frame: Any) -> memoryview:
    buf = frame.buffer if isinstance(frame, zmq.Frame) else memoryview(frame)
    return buf.cast("B") if buf.format != "B" or buf.ndim != 1 else buf


def _check_header(nbytes: int) -> None:
    if nbytes > MAX_HEADER_BYTES:
        raise DecodeError(f"array header of {nbytes} bytes, the limit is {MAX_HEADER_BYTES} "
                          f"(at most {MAX_DIMS} dimensions)")


def _check_size(raw: memoryview, itemsize: int, shape: tuple[int, ...]) -> None:
    if len(shape) > MAX_DIMS:
        raise DecodeError(f"array of {len(shape)} dimensions, the limit is {MAX_DIMS}")
    if any(d < 0 for d in shape) or math.prod(shape) * itemsize != raw.nbytes:
        raise DecodeError(f"shape {shape} x {itemsize} B does not match {raw.nbytes} B of data")


def _ndarray_from(raw: memoryview, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    if not _RAW_DTYPE.fullmatch(dtype):
        raise DecodeError(f"dtype {dtype!r} cannot be rebuilt from raw bytes")
    dt = np.dtype(dtype)
    _check_size(raw, dt.itemsize, shape)
    return np.frombuffer(raw, dtype=dt).reshape(shape)  # a view: no copy


@functools.cache
def _torch_dtypes() -> dict[str, Any]:
    import torch  # a name from the wire never reaches getattr(torch, ...)

    return {str(d).removeprefix("torch."): d for d in vars(torch).values()
            if isinstance(d, torch.dtype)}


def _tensor_from(raw: memoryview, dtype: str, shape: tuple[int, ...]) -> Any:
    import torch

    dt = _torch_dtypes().get(dtype)
    if dt is None:
        raise DecodeError(f"{dtype!r} is not a torch dtype")
    _check_size(raw, dt.itemsize, shape)
    if raw.nbytes == 0:  # torch.frombuffer rejects empty buffers
        return torch.empty(shape, dtype=dt)
    with warnings.catch_warnings():  # a read-only frame gives a read-only view: do not write
        warnings.simplefilter("ignore", UserWarning)
        return torch.frombuffer(raw, dtype=torch.uint8).view(dt).view(shape)
