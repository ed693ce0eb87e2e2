"""Exercise 431, reference answer: a remote reader of the broadcast ring, over TCP.

A reader on another node cannot map the writer's shared memory: it gets every message over
ZMQ PUB/SUB instead. The writer binds an XPUB, counts one subscription per remote reader and
then publishes READY; each reader subscribes, waits for READY, then reads messages in order.
Every wait takes a timeout: over TCP a dead writer and a silent one look the same (ZMQ
reconnects quietly), so a timeout is how the reader finds out.
"""

from __future__ import annotations

import math
import time

import zmq

READY = b"READY"
SUBSCRIBE = 1  # first byte of a subscription message on an XPUB (0: a subscriber left)


def wait_for_readers(xpub: zmq.Socket, n: int, timeout: float) -> None:
    """Writer side: wait for n subscriptions on `xpub` (XPUB_VERBOSE set), then send READY."""
    deadline = time.monotonic() + timeout
    seen = 0
    while seen < n:
        left = deadline - time.monotonic()
        if left <= 0 or not xpub.poll(math.ceil(left * 1000)):
            raise TimeoutError(f"{seen} of {n} remote readers subscribed within {timeout:g} s")
        if xpub.recv()[0] == SUBSCRIBE:
            seen += 1
    xpub.send(READY)


class RemoteReader:
    """One reader on another node: a SUB socket connected to the writer's XPUB."""

    def __init__(self, address: str):
        self.address = address
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.LINGER, 0)  # a reader has nothing to deliver at close
        self.sock.setsockopt(zmq.RCVHWM, 0)  # never drop: the writer decides the pace
        self.sock.setsockopt(zmq.SUBSCRIBE, b"")
        self.sock.connect(address)

    def _recv(self, deadline: float, what: str, timeout: float) -> list[bytes]:
        left = deadline - time.monotonic()
        if left <= 0 or not self.sock.poll(math.ceil(left * 1000)):
            raise TimeoutError(f"no {what} from the writer at {self.address} within {timeout:g} s: "
                               "is the writer alive and publishing?")
        return self.sock.recv_multipart()

    def wait_until_ready(self, timeout: float) -> None:
        """Block until the writer's READY arrives; RuntimeError if something else comes first."""
        frames = self._recv(time.monotonic() + timeout, "READY", timeout)
        if frames != [READY]:
            raise RuntimeError(f"expected READY from the writer at {self.address}, got "
                               f"{frames[0][:32]!r}: this reader joined after the writer had "
                               "started publishing, so it has missed messages")

    def dequeue(self, timeout: float) -> list[bytes]:
        """The next message's frames, in the order the writer sent them."""
        return self._recv(time.monotonic() + timeout, "message", timeout)

    def read(self, count: int, timeout: float) -> list[list[bytes]]:
        """The next `count` messages, all within `timeout` seconds in total."""
        deadline = time.monotonic() + timeout
        got: list[list[bytes]] = []
        while len(got) < count:
            try:
                got.append(self._recv(deadline, "message", timeout))
            except TimeoutError:
                raise TimeoutError(f"got {len(got)} of {count} messages from the writer at "
                                   f"{self.address} within {timeout:g} s") from None
        return got

    def close(self) -> None:
        """Close the socket and terminate the context; a second call does nothing."""
        if self.ctx.closed:
            return
        self.sock.close()
        self.ctx.term()
