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
def fd_of(tensor: torch.Tensor) -> int:
    """The descriptor of a shared tensor's storage (owned by the storage: do not close it)."""
    fd, _ = tensor.untyped_storage()._share_fd_cpu_()
    return fd


class _Fd:
    def __init__(self, fd):
        self.fd = fd

    def detach(self):
        return self.fd


def map_fd(fd: int, nbytes: int) -> torch.UntypedStorage:
    """Map a received descriptor as a storage of nbytes; closes the descriptor."""
    return rebuild_storage_fd(torch.UntypedStorage, _Fd(fd), nbytes)


def send_fds(conn, fds: list[int]) -> None:
    with socket.socket(fileno=os.dup(conn.fileno())) as sock:
        socket.send_fds(sock, [b"F"], fds)


def recv_fds(conn, n: int) -> list[int]:
    with socket.socket(fileno=os.dup(conn.fileno())) as sock:
        _, fds, _, _ = socket.recv_fds(sock, 1, n)
    return fds


def serve_engine(conn, shapes: dict[str, list[int]], copy_delay_s: float) -> None:
    """The engine process of the judge's tests: apply rounds, report the sum of each weight."""
    import time
    target = {name: torch.zeros(shape) for name, shape in shapes.items()}
    while conn.recv_bytes() == b"round":
        receive_weights(conn, target, before_copy=lambda: time.sleep(copy_delay_s))
        conn.send_bytes(json.dumps({n: t.sum().item() for n, t in target.items()}).encode())


# --- yours -----------------------------------------------------------------------------------
def share(tensors: dict[str, torch.Tensor]) -> tuple[list[dict], list[int]]:
    # TODO: share_memory_() each tensor in place; one meta dict and one fd per tensor
    raise NotImplementedError


def attach(metas: list[dict], fds: list[int]) -> dict[str, torch.Tensor]:
    # TODO: map each fd (map_fd closes it) and view it with the meta's dtype and shape
    raise NotImplementedError


def send_weights(conn, tensors: dict[str, torch.Tensor]) -> None:
    # TODO: share; send the metas as one JSON frame, then the fds; wait for ACK before returning
    raise NotImplementedError


def receive_weights(conn, target: dict[str, torch.Tensor], before_copy=None) -> None:
    # TODO: receive the metas frame and the fds; attach; before_copy(); copy in place; then ACK
    raise NotImplementedError
