"""Hand a model's weights from a trainer process to the engine without sending the bytes.

The trainer sends *handles* (where its tensors live), the engine maps them, copies into its own
weights in place, and acknowledges. Two paths behind one API:

- CUDA: per tensor, torch's `reduce_tensor` exports the cudaMalloc block that holds it as a
  cudaIpcMemHandle (plus offsets and torch's cross-process ref counter). The engine opens it with
  `rebuild_cuda_tensor` (cudaIpcOpenMemHandle inside) and reads the trainer's device memory.
  An interprocess CUDA event, recorded by the trainer after its last write, orders the reads.
- CPU: each storage moves into shared memory (`share_memory_()`, torch's file_descriptor
  strategy: the /dev/shm file is unlinked at once, so only file descriptors name it and nothing
  can be left behind in /dev/shm). The descriptors cross the Unix socket as SCM_RIGHTS ancillary
  data and the engine maps them. One descriptor per distinct storage, not per tensor.

Protocol on one duplex `multiprocessing.Pipe()` (a Unix socketpair), one round:

    trainer                                          engine
    1. frame: msgpack WeightUpdateRequest   ---->    decode
    2. CPU only: the fds, in batches          ---->    receive them (always, to stay in step)
                                                     validate every name, dtype, shape, and
                                                     every storage size, offset, stride, index
                                                     (check_layout); then map, copy in place,
                                                     sync, drop the views
    3. wait, keeping every exported tensor   <----    frame: msgpack WeightUpdateAck(round, error)
    4. drop the references; CUDA: torch.cuda.ipc_collect()

Lifetime rule: between 1 and 3 the trainer neither frees nor writes what it sent. On CUDA, torch's
IPC ref counter keeps a freed block out of the caching allocator ("limbo") until the engine lets go,
but torch's docs still require the sender to keep the tensor alive, and a trainer that exits takes
its memory with it; on both paths an in-place write would give the engine a torn mix of two versions.
Only bytes-sized metadata is encoded (msgpack, never pickle), so the channel carries no code.
A peer that dies, on either side and at any step, surfaces as WeightTransferError. The messages
and the engine's checks on them live in weight_protocol.py.
"""

from __future__ import annotations

import os
import socket
import weakref
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Mapping, Union

import msgspec
import torch
from torch.multiprocessing.reductions import rebuild_cuda_tensor, rebuild_storage_fd, reduce_tensor

from minivllm.distributed.weight_protocol import (CudaStorage, TensorMeta, WeightMismatchError,
                                                  WeightTransferError, WeightUpdateAck,
                                                  WeightUpdateRequest, check_layout, check_update)
from minivllm.utils.runtime_shm import remove_driver_files_at_exit

ACK_TIMEOUT_S = 120.0  # an engine copying GBs on a busy CPU is slow; silence this long is a dead engine
# The descriptors follow their request at once: a trainer silent this long between the two is
# stuck or lying, and waiting longer would hang the engine.
FDS_TIMEOUT_S = 30.0
MAX_FDS_PER_MESSAGE = 250  # Linux refuses more than SCM_MAX_FD (253) descriptors in one message

Weights = Union[torch.nn.Module, Mapping[str, torch.Tensor]]


@dataclass
class WeightHandles:
    """A received round: the request plus the descriptors it owns until used or closed."""
    request: WeightUpdateRequest
    fds: list[int] = field(default_factory=list)
    storages: list[torch.UntypedStorage] = field(default_factory=list)  # CPU: mapped by _rebuild

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []

    def __enter__(self) -> "WeightHandles":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# --- trainer side --------------------------------------------------------------------------
def named_tensors(weights: Weights) -> dict[str, torch.Tensor]:
    """name -> tensor for a module (parameters, then buffers) or a mapping."""
    if isinstance(weights, torch.nn.Module):
        found = dict(weights.named_parameters())
        found.update(weights.named_buffers())
        return {name: t.detach() for name, t in found.items()}
    return {name: t.detach() for name, t in weights.items()}


def export_weights(weights: Weights, round: int = 0
                   ) -> tuple[WeightUpdateRequest, list[int], list[torch.Tensor]]:
    """Handles for `weights`: the request, the fds to pass (CPU) and the tensors to keep alive."""
    tensors = named_tensors(weights)
    devices = {t.device.type for t in tensors.values()}
    if len(devices) != 1 or devices <= {"meta"}:
        raise ValueError(f"export one device at a time; these weights live on {sorted(devices)}")
    if devices == {"cuda"}:
        return _export_cuda(tensors, round)
    return _export_cpu(tensors, round)


def _meta(name: str, t: torch.Tensor, storage: int) -> TensorMeta:
    return TensorMeta(name, str(t.dtype).removeprefix("torch."), list(t.shape), list(t.stride()),
                      t.storage_offset(), storage)


def _export_cpu(tensors: dict[str, torch.Tensor], round: int):
    metas, sizes, fds, index = [], [], [], {}
    for name, t in tensors.items():
        t.share_memory_()  # moves the storage into shared memory once; later rounds are free
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key not in index:
            fd, size = storage._share_fd_cpu_()  # the fd stays owned by the storage
            index[key] = len(sizes)
            sizes.append(size)
            fds.append(fd)
        metas.append(_meta(name, t, index[key]))
    request = WeightUpdateRequest(round, "cpu", metas, cpu_storage_sizes=sizes)
    return request, fds, list(tensors.values())


def _export_cuda(tensors: dict[str, torch.Tensor], round: int):
    metas, storages, keep = [], [], []
    for name, t in tensors.items():
        keep.append(t)
        # One export per tensor: each rebuild on the engine releases exactly one ref count.
        _, args = reduce_tensor(t)
        storages.append(CudaStorage(args[6], args[7], args[8], args[9], args[11], args[12],
                                    args[13], args[14]))
        metas.append(_meta(name, t, len(storages) - 1))
    remove_driver_files_at_exit()  # the driver's file behind interprocess events outlives us
    written = torch.cuda.Event(interprocess=True)  # interprocess events cannot time
    written.record(torch.cuda.current_stream())
    keep.append(written)
    request = WeightUpdateRequest(round, "cuda", metas, cuda_storages=storages,
                                  event_handle=written.ipc_handle())
    return request, [], keep


class WeightSender:
    """Trainer end of the channel. `send` returns when the engine has applied the round."""

    def __init__(self, conn: Connection, ack_timeout_s: float = ACK_TIMEOUT_S):
        self.conn, self.ack_timeout_s, self.round = conn, ack_timeout_s, 0
        self._sock = _unix_socket(conn)
        self._finalizer = weakref.finalize(self, self._sock.close)

    def send(self, weights: Weights) -> None:
        self.round += 1
        request, fds, keep = export_weights(weights, self.round)
        try:
            self.conn.send_bytes(msgspec.msgpack.encode(request))
            for i in range(0, len(fds), MAX_FDS_PER_MESSAGE):
                socket.send_fds(self._sock, [b"F"], fds[i:i + MAX_FDS_PER_MESSAGE])
            if not self.conn.poll(self.ack_timeout_s):
                raise WeightTransferError(f"the engine did not acknowledge round {self.round} within "
                                          f"{self.ack_timeout_s:g} s; is it alive? (its log says why)")
            ack = msgspec.msgpack.decode(self.conn.recv_bytes(), type=WeightUpdateAck)
        except (EOFError, OSError, msgspec.DecodeError) as exc:
            raise _peer_lost("engine", f"round {self.round}", exc) from exc
        del keep  # the lifetime rule: only now may these tensors be freed or written
        if request.device == "cuda":
            torch.cuda.ipc_collect()  # return blocks whose ref count the engine dropped
        if ack.error:
            kind = WeightMismatchError if ack.mismatch else WeightTransferError
            raise kind(f"the engine rejected round {ack.round}: {ack.error}")

    def close(self) -> None:
        self._finalizer()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# --- engine side ---------------------------------------------------------------------------
class WeightReceiver:
    """Engine end of the channel."""

    def __init__(self, conn: Connection):
        self.conn = conn
        self._sock = _unix_socket(conn)
        self._finalizer = weakref.finalize(self, self._sock.close)
        # Last round's CPU mappings. While they live, torch's storage cache (keyed by the shm
        # file's inode) hands the same mapping back for the same segment, so a steady-state
        # round costs one memcpy instead of an mmap and a page fault per 4 KiB. The price: the
        # trainer's old segments stay alive until the next round or close().
        self._mapped: list[torch.UntypedStorage] = []

    def recv(self) -> WeightHandles:
        try:
            request = msgspec.msgpack.decode(self.conn.recv_bytes(), type=WeightUpdateRequest)
        except (EOFError, OSError, msgspec.DecodeError) as exc:
            raise _peer_lost("trainer", "the next request", exc) from exc
        handles = WeightHandles(request)
        try:
            self._recv_fds(handles)
        except BaseException:
            handles.close()
            raise
        return handles

    def _recv_fds(self, handles: WeightHandles) -> None:
        need = len(handles.request.cpu_storage_sizes)
        while len(handles.fds) < need:
            what = f"round {handles.request.round}'s descriptors ({len(handles.fds)} of {need})"
            if not wait([self._sock], FDS_TIMEOUT_S):
                raise WeightTransferError(f"the trainer sent no {what} within {FDS_TIMEOUT_S:g} s")
            try:
                data, fds, _, _ = socket.recv_fds(self._sock, 1, min(MAX_FDS_PER_MESSAGE,
                                                                     need - len(handles.fds)))
            except OSError as exc:
                raise _peer_lost("trainer", what, exc) from exc
            handles.fds += fds
            if not data:  # EOF: the trainer is gone
                raise _peer_lost("trainer", what, EOFError("end of stream"))
            if not fds:
                raise WeightTransferError(f"a frame without descriptors in place of {what}")

    def ack(self, round: int, error: Exception | None = None) -> None:
        ack = WeightUpdateAck(round)
        if error is not None:
            ack.error = f"{type(error).__name__}: {error}"
            ack.mismatch = isinstance(error, WeightMismatchError)
        try:
            self.conn.send_bytes(msgspec.msgpack.encode(ack))
        except OSError as exc:
            raise _peer_lost("trainer", f"round {round}'s ack", exc) from exc

    def receive_into(self, weights: Weights) -> list[str]:
        """One round: receive, apply (all or nothing), acknowledge. Re-raises a rejection."""
        with self.recv() as handles:
            try:
                names = update_weights_from_ipc(weights, handles)
            except Exception as exc:
                self.ack(handles.request.round, exc)
                raise
            self._mapped = handles.storages
        self.ack(handles.request.round)
        return names

    def close(self) -> None:
        self._mapped = []
        self._finalizer()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def update_weights_from_ipc(weights: Weights, handles: WeightHandles) -> list[str]:
    """Copy a received round into `weights` in place, by name; return the names updated.

    Everything is validated before anything is written or mapped, so a mismatch or a malformed
    request leaves the engine as it was. The engine's tensors keep their identity (and data_ptr):
    CUDA graphs and views stay valid.
    """
    targets = named_tensors(weights)
    check_update(targets, handles.request.tensors)
    check_layout(targets, handles.request, handles.fds)
    sources = _rebuild(handles)
    with torch.no_grad():
        for name, src in sources.items():
            targets[name].copy_(src)
    if handles.request.device == "cuda":
        torch.cuda.current_stream().synchronize()  # our reads are done before we ack
    return list(sources)


def _rebuild(handles: WeightHandles) -> dict[str, torch.Tensor]:
    request = handles.request
    if request.device == "cuda":
        return _rebuild_cuda(request)
    fds, handles.fds = handles.fds, []
    handles.storages = [rebuild_storage_fd(torch.UntypedStorage, _Fd(fd), size)  # closes the fd
                        for fd, size in zip(fds, request.cpu_storage_sizes)]
    return {m.name: torch.empty(0, dtype=getattr(torch, m.dtype)).set_(
                handles.storages[m.storage], m.offset, m.shape, m.stride)
            for m in request.tensors}


def _rebuild_cuda(request: WeightUpdateRequest) -> dict[str, torch.Tensor]:
    device = torch.cuda.current_device()  # the engine's own index for this GPU
    if request.event_handle is not None:
        written = torch.cuda.Event.from_ipc_handle(torch.device("cuda", device),
                                                   request.event_handle)
        written.wait(torch.cuda.current_stream())  # reads below queue after the trainer's writes
    out = {}
    for m in request.tensors:
        s = request.cuda_storages[m.storage]
        out[m.name] = rebuild_cuda_tensor(
            torch.Tensor, torch.Size(m.shape), tuple(m.stride), m.offset, torch.storage.TypedStorage,
            getattr(torch, m.dtype), device, s.handle, s.size_bytes, s.offset_bytes, False,
            s.ref_counter_handle, s.ref_counter_offset, s.event_handle, s.event_sync_required)
    return out


def _peer_lost(peer: str, during: str, exc: BaseException) -> WeightTransferError:
    return WeightTransferError(f"the {peer} closed the channel during {during} "
                               f"({type(exc).__name__}: {exc}): it died or closed its end; "
                               "its log says why")


class _Fd:
    """What rebuild_storage_fd expects in place of multiprocessing's DupFd."""

    def __init__(self, fd: int):
        self.fd = fd

    def detach(self) -> int:
        return self.fd


def _unix_socket(conn: Connection) -> socket.socket:
    try:
        sock = socket.socket(fileno=os.dup(conn.fileno()))
    except OSError as exc:
        raise ValueError("weights need a duplex multiprocessing.Pipe() (a Unix socketpair): "
                         f"{exc}") from exc
    if sock.family != socket.AF_UNIX:
        sock.close()
        raise ValueError("file descriptors only cross a Unix socket: use multiprocessing.Pipe()")
    return sock
