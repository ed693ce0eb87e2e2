"""Exercise 122: a shared-memory transfer synchronised by one byte on a pipe. Read README.md.

    slot i at i * slot_bytes: 4-byte little-endian payload length, then the payload
    doorbell pipe: one byte per message, after the message is in its slot
    ack pipe:      one byte per message, after the receiver copied it out

Replace every `raise NotImplementedError` and grade with: python judge.py 122
"""

from __future__ import annotations

import os
import select
from multiprocessing import shared_memory

HEADER = 4  # bytes of the little-endian payload length at the start of each slot
READ_MAX = 4096  # doorbell or ack bytes taken in one os.read; any count works


class Sender:
    def __init__(self, buf, slots: int, slot_bytes: int, bell_w: int, ack_r: int):
        self.buf, self.slots, self.slot_bytes = buf, slots, slot_bytes
        self.bell_w, self.ack_r = bell_w, ack_r
        self.head = 0  # messages sent so far; the next goes into slot head % slots
        self.credits = slots  # free slots

    def send(self, payload: bytes, timeout: float = 5.0) -> None:
        # TODO: ValueError if too big; while no credit, select on ack_r (TimeoutError) and
        # count the ack bytes; write length + payload into the slot; then ring the doorbell
        raise NotImplementedError

    def flush(self, timeout: float = 5.0) -> None:
        # TODO: wait for acks until every slot is free again (TimeoutError)
        raise NotImplementedError


class Receiver:
    def __init__(self, buf, slots: int, slot_bytes: int, bell_r: int, ack_w: int):
        self.buf, self.slots, self.slot_bytes = buf, slots, slot_bytes
        self.bell_r, self.ack_w = bell_r, ack_w
        self.tail = 0  # messages received so far; the next is in slot tail % slots
        self.pending = 0  # doorbell bytes read whose messages are not yet copied out

    def recv(self, timeout: float = 5.0) -> bytes | None:
        # TODO: if nothing pending, select on bell_r (None on timeout), os.read, EOFError on b"",
        # count the doorbell bytes; copy the payload out as bytes; then write one ack byte
        raise NotImplementedError


class DoorbellChannel:
    """Owns the segment and both pipes. Create it before fork; each process then keeps its side."""

    def __init__(self, slots: int, slot_bytes: int):
        self.slots, self.slot_bytes = slots, slot_bytes
        # TODO: self.shm = a new SharedMemory of slots * slot_bytes, prefaulted; self.name;
        # self.bell_r, self.bell_w = os.pipe(); self.ack_r, self.ack_w = os.pipe()
        raise NotImplementedError

    def sender(self) -> Sender:
        return Sender(self.shm.buf, self.slots, self.slot_bytes, self.bell_w, self.ack_r)

    def receiver(self) -> Receiver:
        return Receiver(self.shm.buf, self.slots, self.slot_bytes, self.bell_r, self.ack_w)

    def keep(self, side: str) -> None:
        """After a fork: close the two pipe ends that the other side uses."""
        raise NotImplementedError  # TODO

    def close(self) -> None:
        """Close this process's pipe ends and mapping; the creating process also unlinks."""
        raise NotImplementedError  # TODO
