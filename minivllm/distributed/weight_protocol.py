"""The wire of a weight hand-off (weight_transfer.py) and the checks the engine runs on it.

The trainer's request names each tensor as a view (shape, stride, offset in elements) of a
storage: a CPU segment whose descriptor follows the request, or a CUDA block. The engine trusts
none of it: `check_update` matches names, shapes and dtypes against its own weights, and
`check_layout` proves that every view lies inside a storage the round really holds, before
anything is mapped or written.
"""

from __future__ import annotations

import math
import os
from typing import Mapping

import msgspec
import torch


class TensorMeta(msgspec.Struct, array_like=True):
    """One tensor: a view (offset and stride in elements) of storage number `storage`."""
    name: str
    dtype: str  # "float32": torch dtype name without the "torch." prefix
    shape: list[int]
    stride: list[int]
    offset: int
    storage: int


class CudaStorage(msgspec.Struct, array_like=True):
    """What `reduce_tensor` says about a CUDA storage, minus the Python classes."""
    device: int
    handle: bytes  # cudaIpcMemHandle of the whole cudaMalloc block (64 bytes + torch's prefix)
    size_bytes: int
    offset_bytes: int  # where the storage starts inside the block
    ref_counter_handle: bytes
    ref_counter_offset: int
    event_handle: bytes
    event_sync_required: bool


class WeightUpdateRequest(msgspec.Struct):
    round: int
    device: str  # "cpu" or "cuda"
    tensors: list[TensorMeta]
    cpu_storage_sizes: list[int] = []  # bytes; the fds follow on the socket in this order
    cuda_storages: list[CudaStorage] = []
    event_handle: bytes | None = None  # CUDA: ipc handle of the trainer's "written" event


class WeightUpdateAck(msgspec.Struct):
    round: int
    error: str | None = None  # why the engine rejected the round; None means applied
    mismatch: bool = False  # the rejection was a WeightMismatchError (the trainer raises one too)


class WeightMismatchError(ValueError):
    """The update does not fit the engine's weights; nothing was changed."""


class WeightTransferError(RuntimeError):
    """The hand-off itself failed: no ack, a closed channel, a rejected round."""


def check_update(targets: Mapping[str, torch.Tensor], metas: list[TensorMeta]) -> None:
    """Raise WeightMismatchError naming every tensor that does not fit; change nothing."""
    problems = []
    for m in metas:
        t = targets.get(m.name)
        if t is None:
            problems.append(f"{m.name!r}: the engine has no such weight")
        elif list(t.shape) != m.shape:
            problems.append(f"{m.name!r}: engine shape {list(t.shape)}, update shape {m.shape}")
        elif str(t.dtype).removeprefix("torch.") != m.dtype:
            problems.append(f"{m.name!r}: engine dtype {t.dtype}, update dtype torch.{m.dtype}")
    if problems:
        raise WeightMismatchError(f"{len(problems)} of {len(metas)} tensors do not fit; no weight "
                                  "was changed. " + "; ".join(problems))


def check_layout(targets: Mapping[str, torch.Tensor], request: WeightUpdateRequest,
                 fds: list[int]) -> None:
    """Raise WeightTransferError unless every view lies inside a storage that exists and really
    holds the bytes claimed (CPU: the size of the segment behind each descriptor): a lying
    request must make the engine map, grow or read nothing. Run after check_update (names,
    shapes and dtypes already match the targets)."""
    if request.device == "cuda":
        sizes = [s.size_bytes for s in request.cuda_storages]
        problems = []
    else:
        sizes = request.cpu_storage_sizes
        if len(fds) != len(sizes):
            raise WeightTransferError(f"round {request.round}: {len(fds)} descriptors for "
                                      f"{len(sizes)} storages")
        real = [os.fstat(fd).st_size for fd in fds]
        problems = [f"storage {i} claims {size} bytes, its segment holds {have} bytes"
                    for i, (size, have) in enumerate(zip(sizes, real)) if not 0 <= size <= have]
    problems += [p for m in request.tensors
                 if (p := _view_problem(m, sizes, targets[m.name].element_size()))]
    if problems:
        raise WeightTransferError(f"round {request.round} is malformed, nothing was changed: "
                                  + "; ".join(problems))


def _view_problem(m: TensorMeta, sizes: list[int], itemsize: int) -> str | None:
    """What is wrong with tensor m's view of its storage, or None."""
    if not 0 <= m.storage < len(sizes):
        return f"{m.name!r} refers to storage {m.storage}, the round has {len(sizes)}"
    if len(m.stride) != len(m.shape):
        return f"{m.name!r}: stride {m.stride} for shape {m.shape}"
    if m.offset < 0:
        return f"{m.name!r}: negative offset {m.offset}"
    dims = sorted((s, d) for s, d in zip(m.stride, m.shape) if d > 1)
    span = 1  # elements covered by the dims so far: the next stride must step past them
    for s, d in dims:
        if s < span:
            return (f"{m.name!r}: stride {m.stride} for shape {m.shape} repeats or reverses "
                    "elements (zero, negative or overlapping)")
        span = s * d
    end = m.offset + 1 + sum((d - 1) * s for s, d in dims) if math.prod(m.shape) else m.offset
    if end * itemsize > sizes[m.storage]:
        return (f"{m.name!r} ends at byte {end * itemsize}, past the {sizes[m.storage]} bytes of "
                f"storage {m.storage}")
    return None
