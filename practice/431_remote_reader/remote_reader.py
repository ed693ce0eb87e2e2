"""Exercise 431: a remote reader of the broadcast ring, over TCP (see README.md).

A reader on another node gets every message of the ring over ZMQ PUB/SUB: the writer binds an
XPUB, waits for one subscription per remote reader, then sends READY. Grade with
`python judge.py 431`.
"""

from __future__ import annotations

import time  # noqa: F401 - you will want time.monotonic()

import zmq

READY = b"READY"
SUBSCRIBE = 1  # first byte of a subscription message on an XPUB (0: a subscriber left)


def wait_for_readers(xpub: zmq.Socket, n: int, timeout: float) -> None:
    """Writer side: wait for n subscriptions on `xpub` (XPUB_VERBOSE set), then send READY.

    Raise TimeoutError("<seen> of <n> remote readers subscribed within <timeout> s") when the
    timeout (one deadline for the whole call) runs out first.
    """
    raise NotImplementedError("count the subscriptions, then send READY")


class RemoteReader:
    """One reader on another node: a SUB socket connected to the writer's XPUB."""

    def __init__(self, address: str):
        raise NotImplementedError("your own zmq.Context; a SUB that subscribes to b'' and connects")

    def wait_until_ready(self, timeout: float) -> None:
        """Block until READY arrives. TimeoutError (naming the address) after `timeout` s;
        RuntimeError naming what came if the first message is not READY."""
        raise NotImplementedError

    def dequeue(self, timeout: float) -> list[bytes]:
        """The next message's frames as a list of bytes; TimeoutError after `timeout` s."""
        raise NotImplementedError

    def read(self, count: int, timeout: float) -> list[list[bytes]]:
        """The next `count` messages within `timeout` seconds in total."""
        raise NotImplementedError

    def close(self) -> None:
        """Close the socket and terminate the context; a second call does nothing."""
        raise NotImplementedError
