"""Exercise 432, reference answer: detecting a dead remote peer by heartbeats.

Across machines there is no process sentinel and no pidfd: the only news from a peer is its
TCP connection. Each peer sends a heartbeat byte every so often. A peer whose process died on
a live host closes its connection (the kernel sends FIN or RST): that is seen at once. A peer
that is paused, hung, or behind a dead link just goes quiet: only a deadline on its last
heartbeat finds it. Time comes from `clock`, so that a test can drive it.
"""

from __future__ import annotations

import selectors
import socket
import time
from typing import Callable

CLOSED = "closed"  # the connection ended: the peer's process is gone  # pragma: no mutate
SILENT = "silent"  # nothing heard for longer than the deadline: paused, hung, or cut off  # pragma: no mutate
READ_BYTES = 4096


class PeerWatch:
    """Watches one connected TCP socket per peer; owns the sockets."""

    def __init__(self, peers: dict[str, socket.socket], deadline: float,
                 clock: Callable[[], float] = time.monotonic):
        if deadline <= 0:
            raise ValueError(f"deadline must be > 0 seconds, got {deadline}")
        self.deadline, self.clock = deadline, clock
        self.selector = selectors.DefaultSelector()
        now = clock()
        self.last_heard: dict[str, float] = {}
        for name, sock in peers.items():
            sock.setblocking(False)
            self.selector.register(sock, selectors.EVENT_READ, name)
            self.last_heard[name] = now

    def check(self, wait: float = 0.0) -> dict[str, str]:
        """Read what has arrived (waiting at most `wait` s if nothing has), then return the
        peers newly found dead: {name: CLOSED or SILENT}. A reported peer is no longer watched."""
        heard, ended = self._drain(wait)
        now = self.clock()  # after reading: a stalled detector does not blame its peers
        for name in heard:
            self.last_heard[name] = now
        verdicts = {name: CLOSED for name in ended}
        for name, last in self.last_heard.items():
            if name not in verdicts and now - last > self.deadline:
                verdicts[name] = SILENT
        for name in verdicts:
            self._forget(name)
        return verdicts

    def _drain(self, wait: float) -> tuple[set[str], set[str]]:
        """Read every ready socket to the end of what it holds: (heard, ended) peer names."""
        heard, ended = set(), set()
        if not self.last_heard:
            return heard, ended
        for key, _ in self.selector.select(wait):
            name = key.data
            try:
                while key.fileobj.recv(READ_BYTES):
                    heard.add(name)
                ended.add(name)  # recv returned b"": the peer closed (FIN)
            except BlockingIOError:
                pass  # read all there was
            except ConnectionResetError:
                ended.add(name)  # RST: the peer's kernel dropped the connection
        return heard, ended

    def _forget(self, name: str) -> None:
        sock = next(k.fileobj for k in self.selector.get_map().values() if k.data == name)
        self.selector.unregister(sock)
        sock.close()
        del self.last_heard[name]

    def close(self) -> None:
        """Close every socket still watched and the selector; a second call does nothing."""
        for name in list(self.last_heard):
            self._forget(name)
        self.selector.close()
