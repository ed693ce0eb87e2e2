"""Reference answer of exercise 121."""

from __future__ import annotations

import socket
import struct

HEADER = struct.Struct("!I")  # 4-byte big-endian length (network byte order)


def send_frame(sock: socket.socket, payload: bytes) -> None:
    if len(payload) >= 2**32:
        raise ValueError(f"a frame holds at most 2**32 - 1 bytes, got {len(payload)}")
    sock.sendall(HEADER.pack(len(payload)) + payload)


def recv_exact(sock: socket.socket, n: int) -> bytes:
    pieces, got = [], 0
    while got < n:
        piece = sock.recv(n - got)
        if not piece:
            raise ConnectionError(f"peer closed with {n - got} of {n} bytes missing")
        pieces.append(piece)
        got += len(piece)
    return b"".join(pieces)


def recv_frame(sock: socket.socket) -> bytes | None:
    first = sock.recv(1)
    if not first:
        return None  # a clean end between frames
    (length,) = HEADER.unpack(first + recv_exact(sock, HEADER.size - 1))
    return recv_exact(sock, length)
