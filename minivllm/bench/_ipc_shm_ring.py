"""The shared-memory ring of `minivllm bench ipc` (`shm`, `shm_copy`): one sender, one
receiver, slots of one message each, two counters and two pipes to sleep on (ShmRing).

Chapter 02 compares it with pipes and sockets; chapter 05, section 4.7, measures what it pays
against memcpy and what each part of its design bought.
"""

from __future__ import annotations

import os
import select
import time
from typing import TYPE_CHECKING

from minivllm.distributed.shm_ring import memory_fence

if TYPE_CHECKING:
    from minivllm.bench._ipc_transports import FdStream

RING_BYTES = 64 * 2**20  # the shm ring: 64 slots of 1 MiB, far beyond L2, like a real batch
MAX_SLOTS = 64  # more slots only add memory, not overlap
MIN_SLOTS = 2  # double buffering: the sender fills one slot while the receiver drains another
# The control region after the slots: one 64-byte cache line per flag or counter, so that a
# store by one side never invalidates a line the other side is polling for something else.
LINE = 64
PING, PONG = 0, LINE  # the round trip's flags
HEAD, TAIL = 2 * LINE, 3 * LINE  # u64: messages the sender published, the receiver released
# u64 counter values at which a side about to sleep on its pipe wants a byte there (0: awake)
RECV_WAKE_AT, SEND_WAKE_AT = 4 * LINE, 5 * LINE
CTRL_BYTES = 6 * LINE
SPIN_BEFORE_BLOCK_S = 0.0  # spinning first costs other programs a core: chapter 05 measures it
SPIN_CHECK_EVERY = 1024  # spins between clock reads while waiting on a flag
SPIN_TIMEOUT_S = 10.0  # a flag not seen in this long means the peer is gone
BELL_READ_MAX = 4096  # doorbell bytes read at once: that many slots become ready


def slots_for(size: int) -> int:
    return max(MIN_SLOTS, min(MAX_SLOTS, RING_BYTES // max(size, 1)))


class ShmRing:
    """One end of the ring. `ring` maps RING_BYTES + CTRL_BYTES of the same segment.

    Message k goes into slot k % slots. The sender copies it there, then stores HEAD = k + 1;
    the receiver uses the slot, then stores TAIL = k + 1, which gives the slot back. Each
    counter has a cache line of its own. A side that finds nothing to do (no message; no free
    slot) may spin for spin_s, then writes into its wake-at word the count it wants to see,
    looks once more and sleeps on its pipe; the other side writes a byte there only when its
    counter reaches that word. The doorbell is batched: the in-place receiver asks for a
    quarter of the ring at once (each wake-up of a sleeping process cost the sender about
    27 us on a quiet 2 vCPU VM, a quarter of a 1 MiB copy; chapter 05), the sender for a
    quarter of the ring free. A receiver that copies each message out asks for the next one:
    its copies overlap the sender's only if it starts each as soon as it can.
    """

    def __init__(self, ring: memoryview, bell: FdStream, ack: FdStream):
        self.ring, self.bell, self.ack = ring, bell, ack
        self.flags = ring[RING_BYTES:RING_BYTES + CTRL_BYTES]
        self.counts = self.flags.cast("Q")  # the counters and wake-at words, 8 bytes each
        self.spin_s = SPIN_BEFORE_BLOCK_S
        self.recv_batch: int | None = None  # messages a waiting receiver asks for; None: above

    def release(self) -> None:
        """Drop the views of the segment (they must go before it is closed)."""
        self.counts.release()
        self.flags.release()

    def send_stream(self, src: memoryview, count: int) -> None:
        size, slots, counts = len(src), slots_for(len(src)), self.counts
        head, batch = counts[HEAD // 8], max(1, slots // 4)
        for _ in range(count):
            if head - counts[TAIL // 8] >= slots:  # every slot holds an unread message
                self._wait(TAIL, head - slots + 1, head - slots + batch, SEND_WAKE_AT,
                           self.ack.rfd)
            off = (head % slots) * size
            self.ring[off:off + size] = src  # the one copy on this side
            head += 1
            self._publish(HEAD, head, RECV_WAKE_AT, self.bell.wfd)
        self._wait(TAIL, head, head, SEND_WAKE_AT, self.ack.rfd)  # every slot back

    def recv_stream(self, dst: memoryview, count: int, copy_out: bool) -> None:
        """copy_out=False reads in place: it checks the first and last byte of each message,
        the way a consumer that wraps the slot as an array (np.frombuffer) costs nothing more."""
        size, slots, counts = len(dst), slots_for(len(dst)), self.counts
        batch = self.recv_batch or (1 if copy_out else max(1, slots // 4))
        tail = counts[TAIL // 8]
        end = tail + count
        for _ in range(count):
            if counts[HEAD // 8] == tail:
                self._wait(HEAD, tail + 1, min(tail + batch, end), RECV_WAKE_AT, self.bell.rfd)
            off = (tail % slots) * size
            if copy_out:
                dst[:] = self.ring[off:off + size]  # the one copy on this side
            elif self.ring[off] != self.ring[off + size - 1]:
                raise ValueError("a torn message in the shm ring")
            tail += 1
            self._publish(TAIL, tail, SEND_WAKE_AT, self.ack.wfd)

    def _publish(self, counter: int, value: int, peer_wake_at: int, peer_fd: int) -> None:
        """Store our counter after the slot's bytes; ring the peer if it sleeps until this."""
        counts = self.counts
        memory_fence()  # the slot's bytes before the counter (x86 keeps this order anyway)
        counts[counter // 8] = value
        memory_fence()  # the counter before we load the peer's wake-at (Dekker's order)
        wake_at = counts[peer_wake_at // 8]
        if wake_at and value >= wake_at:
            counts[peer_wake_at // 8] = 0
            os.write(peer_fd, b"\x01")

    def _wait(self, counter: int, need: int, want: int, wake_at: int, fd: int) -> None:
        """Return once the peer's counter reaches `need`; a sleep lasts until it reaches `want`.

        Spin (yield) for spin_s, then store want in our wake-at word, fence, look once more,
        and sleep on fd. The peer stores its counter, fences and loads our word: at least one
        of the two sees the other's store, so no wake-up is lost. A stale byte (the peer rang
        as our last look succeeded) ends one later sleep early; the loop looks again."""
        counts, slot = self.counts, counter // 8
        now = time.monotonic()
        spin_until, deadline = now + self.spin_s, now + SPIN_TIMEOUT_S
        while counts[slot] < need and time.monotonic() < spin_until:
            os.sched_yield()  # about 1 us, and another process may run
        while counts[slot] < need:
            counts[wake_at // 8] = want
            memory_fence()  # our wake-at before our last look (the peer's mirror order)
            if counts[slot] >= want:
                counts[wake_at // 8] = 0
                return
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError(f"the shm peer published nothing in {SPIN_TIMEOUT_S:g} s: "
                                   "is it alive?")
            if not os.read(fd, BELL_READ_MAX):
                raise EOFError("the shm peer closed its pipe")

    def wait_flag(self, where: int, value: int) -> None:
        spins, deadline = 0, time.monotonic() + SPIN_TIMEOUT_S
        while self.flags[where] != value:
            os.sched_yield()  # about 1 us; time.sleep(0) would cost about 60 us
            spins += 1
            if spins % SPIN_CHECK_EVERY == 0 and time.monotonic() > deadline:
                raise TimeoutError(f"shm flag at {where} never became {value}: is the peer alive?")

    def ping(self, src: memoryview, dst: memoryview, seq: int) -> None:
        """Parent: payload into slot 0, raise the ping flag, spin until the pong flag answers."""
        n = len(src)
        self.ring[:n] = src
        self.flags[PING] = seq  # x86 keeps stores in order; chapter 05 covers other CPUs
        self.wait_flag(PONG, seq)
        dst[:] = self.ring[n:2 * n]

    def pong(self, buf: memoryview, seq: int) -> None:
        n = len(buf)
        self.wait_flag(PING, seq)
        buf[:] = self.ring[:n]
        self.ring[n:2 * n] = buf
        self.flags[PONG] = seq


def _seq(i: int) -> int:
    return i % 255 + 1  # a flag byte: consecutive values differ and are never 0
