"""Exercise 302: hand weights over by shared memory, and keep them until the ack.
Read README.md in this folder. Grade with: python judge.py 302
"""

from __future__ import annotations

import json
import os
import socket

import torch
from torch.multiprocessing.reductions import rebuild_storage_fd

ACK = b"ack"


# --- given: the low-level pieces -------------------------------------------------------------
def fd_of(tensor: torch.Tensor) -> int:  # pragma: no mutate block
    """The descriptor of a shared tensor's storage (owned by the storage: do not close it)."""
    fd, _ = tensor.untyped_storage()._share_fd_cpu_()
    return fd


class _Fd:  # pragma: no mutate block
    def __init__(self, fd):
        self.fd = fd

    def detach(self):
        return self.fd


def map_fd(fd: int, nbytes: int) -> torch.UntypedStorage:  # pragma: no mutate block
    """Map a received descriptor as a storage of nbytes; closes the descriptor."""
    return rebuild_storage_fd(torch.UntypedStorage, _Fd(fd), nbytes)


def send_fds(conn, fds: list[int]) -> None:  # pragma: no mutate block
    with socket.socket(fileno=os.dup(conn.fileno())) as sock:
        socket.send_fds(sock, [b"F"], fds)


def recv_fds(conn, n: int) -> list[int]:  # pragma: no mutate block
    with socket.socket(fileno=os.dup(conn.fileno())) as sock:
        _, fds, _, _ = socket.recv_fds(sock, 1, n)
    return fds


def serve_engine(conn, shapes: dict[str, list[int]], copy_delay_s: float) -> None:  # pragma: no mutate block
    """The engine process of the judge's tests: apply rounds, report the sum of each weight."""
    import time
    target = {name: torch.zeros(shape) for name, shape in shapes.items()}
    while conn.recv_bytes() == b"round":
        receive_weights(conn, target, before_copy=lambda: time.sleep(copy_delay_s))
        conn.send_bytes(json.dumps({n: t.sum().item() for n, t in target.items()}).encode())


# --- yours -----------------------------------------------------------------------------------
def share(tensors: dict[str, torch.Tensor]) -> tuple[list[dict], list[int]]:
    metas, fds = [], []
    for name, t in tensors.items():
        t.share_memory_()
        metas.append({"name": name, "dtype": str(t.dtype).removeprefix("torch."),
                      "shape": list(t.shape), "nbytes": t.untyped_storage().nbytes()})
        fds.append(fd_of(t))
    return metas, fds


def attach(metas: list[dict], fds: list[int]) -> dict[str, torch.Tensor]:
    out = {}
    for meta, fd in zip(metas, fds):
        storage = map_fd(fd, meta["nbytes"])
        out[meta["name"]] = torch.empty(0, dtype=getattr(torch, meta["dtype"])).set_(
            storage, 0, meta["shape"])
    return out


def send_weights(conn, tensors: dict[str, torch.Tensor]) -> None:
    metas, fds = share(tensors)
    conn.send_bytes(json.dumps(metas).encode())
    send_fds(conn, fds)
    reply = conn.recv_bytes()  # the lifetime rule: the engine may read until it acks
    if reply != ACK:
        raise RuntimeError(f"expected the engine's ack, got {reply[:40]!r}")


def receive_weights(conn, target: dict[str, torch.Tensor], before_copy=None) -> None:
    metas = json.loads(conn.recv_bytes())
    views = attach(metas, recv_fds(conn, len(metas)))
    if before_copy is not None:
        before_copy()
    with torch.no_grad():
        for name, view in views.items():
            target[name].copy_(view)
    conn.send_bytes(ACK)
