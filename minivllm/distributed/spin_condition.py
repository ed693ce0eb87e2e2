"""SpinCondition: how a MessageQueue reader waits for the writer. Spin, then block.

A reader that read something recently spins: it polls the ring's flag and calls
os.sched_yield() between polls (about 1 µs, and another process may run). Never
time.sleep(0): on CPython 3.11 that is a clock_nanosleep paying ~50 µs of timer slack.
A reader idle for longer than busy_loop_s sets the ring's waiting flag, re-checks the ring
once more, then blocks in zmq poll on two sockets:
  - the writer's notify socket: one byte from an enqueue that found the waiting flag set;
  - an inproc PAIR: shutdown(), from another thread of the reader's process, wakes it.
The writer side is one XPUB socket that never drops (SNDHWM = 0): it notifies only when it
clears a waiting flag, so a dropped notification would be a lost wakeup. The readers' SUB
sockets CONFLATE: at most one notification waits per reader.

vLLM's version (SpinCondition in shm_broadcast.py) notifies after every enqueue, and a zmq
send to two readers costs about 1 µs, more than half of our whole 1.7 µs enqueue. Ours notifies
only when a reader said it is about to block: while readers spin, an enqueue costs one byte read
more than a bare ring's.
No wakeup is lost, by the order of the flag and the chunk (ShmRingBuffer.mark_waiting): the
reader's last look at the ring either finds the message, or comes before the writer reads the
flag, which it then finds set. RECHECK_S is only a safety net (a notification sent before this
reader's subscription was live).
"""

from __future__ import annotations

import itertools
import os
import time
from typing import Callable

import zmq

from minivllm.distributed.shm_ring import ShmRingBuffer

# How long a reader keeps spinning after its last read. Long enough to cover the gap between
# two steps of a busy engine; short enough that an idle engine stops burning a core quickly.
BUSY_LOOP_S = 0.1
# Longest block in poll before the reader re-reads the flag anyway: bounds the cost of a lost
# notification (one that went out before this reader's subscription was live).
RECHECK_S = 1.0
# A busy reader drains its notify socket at most this often, when a wait begins or its index
# wraps around the ring: libzmq queues one internal command per notification until the socket
# is polled (vLLM: SHM_NOTIFY_POLL_INTERVAL_S).
DRAIN_S = 2.0

_cancel_ids = itertools.count()


class SpinCondition:
    """The reader half: wait() returns when it is worth looking at the ring again."""

    def __init__(self, context: zmq.Context, notify_addr: str, ring: ShmRingBuffer,
                 busy_loop_s: float = BUSY_LOOP_S):
        self.ring, self.busy_loop_s = ring, busy_loop_s
        self.last_read = self.last_drain = time.monotonic()
        self.read_after_wait = False
        self.notify = context.socket(zmq.SUB)
        self.notify.setsockopt(zmq.CONFLATE, 1)
        self.notify.setsockopt(zmq.SUBSCRIBE, b"")
        self.notify.connect(notify_addr)
        address = f"inproc://minivllm-cancel-{os.getpid()}-{next(_cancel_ids)}"
        self.cancel_rx = context.socket(zmq.PAIR)
        self.cancel_rx.bind(address)
        self.cancel_tx = context.socket(zmq.PAIR)
        self.cancel_tx.connect(address)
        self.poller = zmq.Poller()
        self.poller.register(self.notify, zmq.POLLIN)
        self.poller.register(self.cancel_rx, zmq.POLLIN)

    def sockets(self) -> list[zmq.Socket]:
        return [self.notify, self.cancel_rx, self.cancel_tx]

    def begin_wait(self) -> None:
        """The ring ran dry: if the last wait ended in a read, the spin window starts now.

        No timestamp per read: a reader that finds data never comes here. The window starts
        at or after the last read, so a reader still blocks only busy_loop_s after it.
        """
        now = time.monotonic()
        if self.read_after_wait:
            self.read_after_wait = False
            self.last_read = now
        self.drain_if_due(now)

    def end_wait(self) -> None:
        """The ring has data again (a wait that times out or is shut down does not get here)."""
        self.read_after_wait = True

    def drain_if_due(self, now: float) -> None:
        if now - self.last_drain > DRAIN_S:
            self.last_drain = now
            if self.notify.poll(0):
                self.notify.recv(zmq.NOBLOCK)

    def wait(self, now: float, deadline: float | None, ready: Callable[[], bool]) -> None:
        """Spin once (yield), or block until a notification, a cancel, or the deadline; `now`
        is the caller's time.monotonic().

        ready() re-reads the ring after the waiting flag is set: see the module docstring.
        """
        if now - self.last_read <= self.busy_loop_s:
            os.sched_yield()
            return
        self.ring.mark_waiting()
        if ready():
            return
        wait_s = RECHECK_S if deadline is None else min(RECHECK_S, max(0.0, deadline - now))
        events = dict(self.poller.poll(timeout=int(wait_s * 1000)))
        if self.notify in events:
            self.notify.recv(zmq.NOBLOCK)  # CONFLATE: at most one is waiting
        if self.cancel_rx in events:
            self.cancel_rx.recv(zmq.NOBLOCK)

    def cancel(self) -> None:
        """Wake a blocked wait(); call from another thread of the same process."""
        self.cancel_tx.send(b"\x00")


def notify_socket(context: zmq.Context, address: str) -> zmq.Socket:
    """The writer half: XPUB so wait_until_ready() can count the readers' subscriptions."""
    sock = context.socket(zmq.XPUB)
    sock.setsockopt(zmq.XPUB_VERBOSE, 1)
    # Never drop. With SNDHWM = 1 a notification was dropped while the writer had not yet seen
    # the reader take the previous one, and the reader slept until RECHECK_S (1 run in 8 of
    # test_readers_that_block_between_messages_miss_no_wakeup). Few are sent: see above.
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.bind(address)
    return sock
