"""Exercise 202: a PUB/SUB start-up that is safe against the slow joiner (see README.md)."""

from __future__ import annotations

import os
import time

import zmq

SUBSCRIBE = 1  # first byte of a subscription message on an XPUB (0 = unsubscribe)
PUBLISH_LINGER_MS = 1000  # messages still queued at close() get this long to leave


class Publisher:
    """An XPUB bound to `address` that can wait for its subscribers before publishing."""

    def __init__(self, address: str):
        self.address = address
        raise NotImplementedError("TODO: a context and an XPUB that reports every "
                                  "subscription, with a bounded linger, bound to address")

    def wait_for_subscribers(self, n: int, timeout: float) -> int:
        """Block until n subscriptions have arrived; return how many have."""
        raise NotImplementedError("TODO: poll the XPUB; count messages starting with SUBSCRIBE")

    def publish(self, message: bytes) -> None:
        raise NotImplementedError("TODO: send the message")

    def close(self) -> None:
        """Close the socket, terminate the context, and remove an ipc socket file."""
        raise NotImplementedError("TODO: close, ctx.term(), os.unlink the ipc file; twice is "
                                  "harmless")


def receive(address: str, count: int, timeout: float) -> list[bytes]:
    """A subscriber: connect, subscribe to everything, return the first `count` messages.

    Returns early with what it has when no message comes for `timeout` seconds.
    """
    raise NotImplementedError("TODO: a SUB that subscribes to b''; poll before each recv; "
                              "close it and terminate its context before returning")
