"""ShmTensorArena: large arrays written once into shared memory, a handle on the wire.

A socket moves every byte twice (into the kernel, out of it) and the receiver needs fresh
memory for each message. For a large tensor between two processes on one machine (the front
end's multimodal inputs on their way to the engine), the sender instead copies it once into a
slot of a shared segment and sends only (slot, dtype, shape); the receiver maps the segment once
and reads the slot in place, with no copy at all.

The arena is a ShmRingBuffer used as max_slots slots (shm_ring.py has the layout and the flag
protocol; a slot is a chunk): the sender takes the first slot that every reader has released,
and a reader releases a slot when the last array viewing it is freed. The sender never waits:
with no free slot, or an array larger than a slot, `put` returns None and the array goes out of
band on the socket as before (MsgpackEncoder does this).

In vLLM: vllm/distributed/device_communicators/shm_tensor_arena.py (ShmTensorArena, the
same slots and flags under MessageQueue), and the multimodal cache's shared-memory object store
between the front end and the engine, vllm/distributed/device_communicators/
shm_object_storage.py (SingleWriterShmObjectStorage).
"""

from __future__ import annotations

import weakref

import numpy as np

from minivllm.distributed.shm_ring import ShmRingBuffer

ARENA_MIN_BYTES = 1 << 20  # below this a socket frame is as fast, and a slot is wasted


class ShmTensorArena:
    """The sender: ShmTensorArena(slot_bytes, max_slots). A reader: ShmTensorArena.attach(handle, rank)."""

    def __init__(self, slot_bytes: int, max_slots: int = 4, n_reader: int = 1,
                 min_bytes: int = ARENA_MIN_BYTES):
        self.ring = ShmRingBuffer(n_reader, slot_bytes, max_slots)
        self.min_bytes, self.rank = min_bytes, -1

    @classmethod
    def attach(cls, handle: tuple[int, int, int, str], rank: int = 0) -> "ShmTensorArena":
        self = cls.__new__(cls)
        self.ring, self.min_bytes, self.rank = ShmRingBuffer(*handle), 0, rank
        return self

    def handle(self) -> tuple[int, int, int, str]:
        return self.ring.handle()

    # --- sender --------------------------------------------------------------------------
    def put(self, raw: memoryview) -> int | None:
        """Copy raw's bytes into a free slot and return its index; None if it should go on
        the socket instead (too small, too large, or every slot still in use)."""
        ring, n = self.ring, raw.nbytes
        if n < self.min_bytes or n > ring.max_chunk_bytes:
            return None
        for slot in range(ring.max_chunks):  # the lowest free slot: its pages are warm
            if ring.writable(slot):
                data = ring.begin_write(slot)
                data[:n] = raw
                data.release()
                ring.end_write(slot)
                return slot
        return None

    # --- reader --------------------------------------------------------------------------
    def view(self, slot: int, nbytes: int) -> np.ndarray:
        """The slot's first nbytes as a read-only uint8 array, in place; the slot is released
        when that array and every view of it are freed."""
        ring = self.ring
        if not 0 <= slot < ring.max_chunks or not 0 <= nbytes <= ring.max_chunk_bytes:
            raise ValueError(f"slot {slot} with {nbytes} bytes is outside the arena "
                             f"({ring.max_chunks} slots of {ring.max_chunk_bytes} bytes)")
        if not ring.readable(slot, self.rank):
            raise ValueError(f"slot {slot} holds nothing for reader {self.rank}: a stale or "
                             "forged handle")
        array = np.frombuffer(ring.chunk(slot)[:nbytes], dtype=np.uint8)
        array.flags.writeable = False
        weakref.finalize(array, _release, ring, slot, self.rank)
        return array

    def close(self) -> None:
        """Unmap (the sender also removes the segment); arrays still viewing it keep the
        mapping until they are freed."""
        self.ring.close()

    def __enter__(self) -> "ShmTensorArena":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _release(ring: ShmRingBuffer, slot: int, rank: int) -> None:
    if ring.buf is not None:  # the arena is still open
        ring.end_read(slot, rank)
