"""Exercise 122, reference solution: a shared-memory transfer synchronised by one byte on a pipe.

The segment holds `slots` slots of `slot_bytes`; message k goes into slot k % slots:

    slot i at i * slot_bytes:  4-byte little-endian payload length, then the payload

Two pipes carry no data, only permission:
    doorbell (sender -> receiver): one byte per message, written AFTER the message is in its slot
    ack      (receiver -> sender): one byte per message, written AFTER the receiver copied it out

The sender holds one credit per free slot and spends one per message; an ack gives one back.
Bytes written one by one may come out of one os.read, so both sides count bytes, not reads.
"""

from __future__ import annotations

import os
import select
from multiprocessing import shared_memory

HEADER = 4  # bytes of the little-endian payload length at the start of each slot
READ_MAX = 4096  # doorbell or ack bytes taken in one os.read; any count works  # pragma: no mutate


def _wait_readable(fd: int, timeout: float) -> bool:
    ready, _, _ = select.select([fd], [], [], timeout)
    return bool(ready)


class Sender:
    def __init__(self, buf, slots: int, slot_bytes: int, bell_w: int, ack_r: int):  # pragma: no mutate block
        self.buf, self.slots, self.slot_bytes = buf, slots, slot_bytes
        self.bell_w, self.ack_r = bell_w, ack_r
        self.head = 0  # messages sent so far; the next goes into slot head % slots
        self.credits = slots  # slots the receiver has given back (free to write)

    def _take_acks(self, timeout: float) -> None:
        if not _wait_readable(self.ack_r, timeout):
            raise TimeoutError(f"no ack within {timeout} s: is the receiver alive and reading?")
        acks = os.read(self.ack_r, READ_MAX)
        if not acks:
            raise EOFError("the receiver closed the ack pipe")
        self.credits += len(acks)  # one credit per byte, however many came in this read

    def send(self, payload: bytes, timeout: float = 5.0) -> None:
        if len(payload) > self.slot_bytes - HEADER:
            raise ValueError(f"payload of {len(payload)} bytes does not fit a slot of "
                             f"{self.slot_bytes - HEADER} payload bytes")
        while self.credits == 0:  # every slot holds a message not yet acknowledged
            self._take_acks(timeout)
        start = (self.head % self.slots) * self.slot_bytes
        self.buf[start:start + HEADER] = len(payload).to_bytes(HEADER, "little")
        self.buf[start + HEADER:start + HEADER + len(payload)] = payload  # the message first ...
        os.write(self.bell_w, b"\x01")  # ... then the doorbell
        self.head += 1
        self.credits -= 1

    def flush(self, timeout: float = 5.0) -> None:
        while self.credits < self.slots:
            self._take_acks(timeout)


class Receiver:
    def __init__(self, buf, slots: int, slot_bytes: int, bell_r: int, ack_w: int):  # pragma: no mutate block
        self.buf, self.slots, self.slot_bytes = buf, slots, slot_bytes
        self.bell_r, self.ack_w = bell_r, ack_w
        self.tail = 0  # messages received so far; the next is in slot tail % slots
        self.pending = 0  # doorbell bytes read but whose messages are not yet copied out

    def recv(self, timeout: float = 5.0) -> bytes | None:
        if self.pending == 0:
            if not _wait_readable(self.bell_r, timeout):
                return None
            bells = os.read(self.bell_r, READ_MAX)
            if not bells:
                raise EOFError("the sender closed the doorbell: no more messages")
            self.pending += len(bells)  # several messages may ring in one read
        start = (self.tail % self.slots) * self.slot_bytes
        size = int.from_bytes(self.buf[start:start + HEADER], "little")
        payload = bytes(self.buf[start + HEADER:start + HEADER + size])  # copy out first ...
        os.write(self.ack_w, b"\x01")  # ... then give the slot back
        self.tail += 1
        self.pending -= 1
        return payload


class DoorbellChannel:
    """Owns the segment and both pipes. Create it before fork; each process then keeps its side."""

    def __init__(self, slots: int, slot_bytes: int):
        self.slots, self.slot_bytes = slots, slot_bytes
        size = slots * slot_bytes
        self.shm = shared_memory.SharedMemory(create=True, size=size)
        self.shm.buf[:size] = bytes(size)  # prefault: touch every page once, now
        self.name = self.shm.name
        self.creator_pid = os.getpid()
        self.bell_r, self.bell_w = os.pipe()
        self.ack_r, self.ack_w = os.pipe()
        self.open_fds = {self.bell_r, self.bell_w, self.ack_r, self.ack_w}

    def sender(self) -> Sender:  # pragma: no mutate block
        return Sender(self.shm.buf, self.slots, self.slot_bytes, self.bell_w, self.ack_r)

    def receiver(self) -> Receiver:  # pragma: no mutate block
        return Receiver(self.shm.buf, self.slots, self.slot_bytes, self.bell_r, self.ack_w)

    def keep(self, side: str) -> None:
        """After a fork: close the two pipe ends that the other side uses."""
        if side not in ("sender", "receiver"):
            raise ValueError(f"side must be 'sender' or 'receiver', got {side!r}")
        others = (self.bell_r, self.ack_w) if side == "sender" else (self.bell_w, self.ack_r)
        for fd in others:
            self._close_fd(fd)

    def _close_fd(self, fd: int) -> None:
        if fd in self.open_fds:
            self.open_fds.discard(fd)
            os.close(fd)

    def close(self) -> None:
        """Close this process's pipe ends and mapping; the creating process also unlinks."""
        for fd in sorted(self.open_fds):
            self._close_fd(fd)
        if self.shm is None:
            return  # closed already
        self.shm.close()
        if os.getpid() == self.creator_pid:  # a forked child closes, only the creator unlinks
            self.shm.unlink()
        self.shm = None
