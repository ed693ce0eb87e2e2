"""Exercise 121: length-prefixed framing. Read README.md in this folder.

Replace every `raise NotImplementedError` and grade with: python judge.py 121
"""

from __future__ import annotations

import socket
import struct

HEADER = struct.Struct("!I")  # 4-byte big-endian length (network byte order)


def send_frame(sock: socket.socket, payload: bytes) -> None:
    # TODO: header, then payload; reject payloads that do not fit in 4 bytes
    raise NotImplementedError


def recv_exact(sock: socket.socket, n: int) -> bytes:
    # TODO: loop over partial recv()s; ConnectionError if EOF comes first
    raise NotImplementedError


def recv_frame(sock: socket.socket) -> bytes | None:
    # TODO: None on a clean EOF between frames, ConnectionError inside one
    raise NotImplementedError
