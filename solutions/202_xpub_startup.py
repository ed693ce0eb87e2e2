"""Exercise 202, reference answer: a PUB/SUB start-up that is safe against the slow joiner.

The publisher binds an XPUB and waits until it has received N subscriptions before it sends
anything: a PUB drops every message for a subscriber whose subscription has not arrived yet.
"""

from __future__ import annotations

import os
import time

import zmq

SUBSCRIBE = 1  # first byte of a subscription message on an XPUB (0 = unsubscribe)
PUBLISH_LINGER_MS = 1000  # messages still queued at close() get this long to leave  # pragma: no mutate


class Publisher:
    """An XPUB bound to `address` that can wait for its subscribers before publishing."""

    def __init__(self, address: str):
        self.address = address
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.XPUB)
        self.sock.setsockopt(zmq.XPUB_VERBOSE, 1)  # pass on every subscription, not only new topics
        self.sock.setsockopt(zmq.LINGER, PUBLISH_LINGER_MS)
        self.sock.bind(address)
        self.subscribers = 0

    def wait_for_subscribers(self, n: int, timeout: float) -> int:
        """Block until n subscriptions have arrived; return how many have."""
        deadline = time.monotonic() + timeout
        while self.subscribers < n:
            left = deadline - time.monotonic()
            if left <= 0 or not self.sock.poll(int(left * 1000)):
                raise TimeoutError(f"{self.subscribers} of {n} subscribers joined within "
                                   f"{timeout:g} s")
            if self.sock.recv()[0] == SUBSCRIBE:
                self.subscribers += 1
        return self.subscribers

    def publish(self, message: bytes) -> None:
        self.sock.send(message)

    def close(self) -> None:
        """Close the socket, terminate the context, and remove an ipc socket file."""
        if self.ctx.closed:
            return
        self.sock.close()
        self.ctx.term()
        if self.address.startswith("ipc://"):  # libzmq 4.3 leaves a bound ipc file behind
            try:
                os.unlink(self.address.removeprefix("ipc://"))
            except FileNotFoundError:
                pass


def receive(address: str, count: int, timeout: float) -> list[bytes]:
    """A subscriber: connect, subscribe to everything, return the first `count` messages.

    Returns early with what it has when no message comes for `timeout` seconds.
    """
    ctx = zmq.Context()
    sock = ctx.socket(zmq.SUB)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(address)
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        got: list[bytes] = []
        while len(got) < count and sock.poll(int(timeout * 1000)):
            got.append(sock.recv())
        return got
    finally:
        sock.close()
        ctx.term()
