"""Exercise 432: detecting a dead remote peer by heartbeats (see README.md).

Each peer on another host sends a heartbeat byte on its TCP connection every so often. Report a
peer CLOSED when its connection ends, SILENT when nothing has come from it for longer than the
deadline by `clock`. Grade with `python judge.py 432`.
"""

from __future__ import annotations

import selectors  # noqa: F401 - one way to wait on many sockets at once
import socket
import time
from typing import Callable

CLOSED = "closed"  # the connection ended: the peer's process is gone
SILENT = "silent"  # nothing heard for longer than the deadline: paused, hung, or cut off


class PeerWatch:
    """Watches one connected TCP socket per peer; owns the sockets."""

    def __init__(self, peers: dict[str, socket.socket], deadline: float,
                 clock: Callable[[], float] = time.monotonic):
        raise NotImplementedError("register the sockets; every peer was last heard at clock()")

    def check(self, wait: float = 0.0) -> dict[str, str]:
        """Read what has arrived (waiting at most `wait` s if nothing has), then return the
        peers newly found dead: {name: CLOSED or SILENT}. A reported peer is no longer watched."""
        raise NotImplementedError

    def close(self) -> None:
        """Close every socket still watched; a second call does nothing."""
        raise NotImplementedError
