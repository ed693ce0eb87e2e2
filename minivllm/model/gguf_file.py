"""A direct reader for GGUF files: the header, the metadata and the tensor table.

`gguf.GGUFReader` builds a numpy view for every field and every vocabulary entry, which takes
8 to 19 s for a 49k-token vocabulary. Reading the same layout with `struct` takes well under a
second; the `gguf` package still does the dequantizing (`gguf.quants.dequantize`).

Layout (little endian, spec: github.com/ggml-org/ggml/blob/master/docs/gguf.md):

    magic "GGUF" | version u32 | n_tensors u64 | n_kv u64
    n_kv x  (key: string, value_type: u32, value)
    n_tensors x (name: string, n_dims: u32, dims: u64 x n_dims (fastest first), type: u32, offset: u64)
    padding to `general.alignment` (default 32), then the tensor data; offsets are relative to it.

A string is a u64 length and UTF-8 bytes; an array is an item type u32, a count u64, the items.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32  # the spec's default when general.alignment is absent

# GGUF value type -> struct format of one scalar
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
           10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_NUMPY = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32,
          6: np.float32, 7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}


@dataclass
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # numpy order (slowest first): the reverse of GGUF's dims
    qtype: GGMLQuantizationType
    offset: int  # absolute byte offset in the file
    nbytes: int


class GGUFFile:
    """Metadata as a dict of Python values; tensors dequantized on demand to float32 numpy."""

    def __init__(self, path: str) -> None:
        self.path = path
        with open(path, "rb") as f:
            self._buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self._pos = 0
        if self._buf[:4] != GGUF_MAGIC:
            raise ValueError(f"{path} is not a GGUF file (magic {bytes(self._buf[:4])!r})")
        self.version, n_tensors, n_kv = struct.unpack_from("<IQQ", self._buf, 4)
        self._pos = 24
        self.metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = self._string()
            self.metadata[key] = self._value(self._u32())
        infos = [self._tensor_info() for _ in range(n_tensors)]
        align = int(self.metadata.get("general.alignment", DEFAULT_ALIGNMENT))
        data_start = (self._pos + align - 1) // align * align
        self.tensors: dict[str, TensorInfo] = {}
        for name, shape, qtype, offset in infos:
            block, type_size = GGML_QUANT_SIZES[qtype]
            nbytes = int(np.prod(shape)) // block * type_size
            self.tensors[name] = TensorInfo(name, shape, qtype, data_start + offset, nbytes)

    def close(self) -> None:
        self._buf.close()

    def __enter__(self) -> "GGUFFile":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def tensor(self, name: str) -> np.ndarray:
        """Dequantize one tensor to a float32 array of its numpy shape (a copy: the file's
        memory map closes with this object)."""
        info = self.tensors[name]
        array = dequantize(self.raw(name), info.qtype).reshape(info.shape)
        return array.copy() if info.qtype == GGMLQuantizationType.F32 else array  # F32 is a view

    def raw(self, name: str) -> np.ndarray:
        """One tensor's bytes as stored (a read-only view of the memory map: copy it to keep)."""
        info = self.tensors[name]
        return np.frombuffer(self._buf, np.uint8, info.nbytes, info.offset)

    # -- parsing ------------------------------------------------------------------------
    def _u32(self) -> int:
        (v,) = struct.unpack_from("<I", self._buf, self._pos)
        self._pos += 4
        return v

    def _u64(self) -> int:
        (v,) = struct.unpack_from("<Q", self._buf, self._pos)
        self._pos += 8
        return v

    def _string(self) -> str:
        n = self._u64()
        s = self._buf[self._pos:self._pos + n].decode("utf-8", errors="replace")
        self._pos += n
        return s

    def _value(self, vtype: int) -> Any:
        if vtype == _STRING:
            return self._string()
        if vtype == _ARRAY:
            item_type, count = self._u32(), self._u64()
            if item_type in _NUMPY:  # numeric arrays in one read
                arr = np.frombuffer(self._buf, _NUMPY[item_type], count, self._pos)
                self._pos += arr.nbytes
                return arr.tolist()
            return [self._value(item_type) for _ in range(count)]
        fmt = _SCALAR[vtype]
        (v,) = struct.unpack_from(fmt, self._buf, self._pos)
        self._pos += struct.calcsize(fmt)
        return v

    def _tensor_info(self) -> tuple[str, tuple[int, ...], GGMLQuantizationType, int]:
        name = self._string()
        n_dims = self._u32()
        dims = struct.unpack_from(f"<{n_dims}Q", self._buf, self._pos)
        self._pos += 8 * n_dims
        qtype = GGMLQuantizationType(self._u32())
        return name, tuple(reversed(dims)), qtype, self._u64()
