"""The judge's tests for exercise 214. Each receives the learner's module as `impl`."""

from __future__ import annotations

import array
import multiprocessing as mp
import random

from minivllm.judge.api import Fail, check_equal, scaled, test

RING_WAIT_S = scaled(10.0)  # a chunk not written or read in this long means a protocol bug


def _packed(frames) -> bytes:
    """The expected bytes, written out independently of the learner's code."""
    out = bytes([0]) + len(frames).to_bytes(2, "little")
    out += b"".join(memoryview(f).nbytes.to_bytes(4, "little") for f in frames)
    return out + b"".join(memoryview(f).cast("B").tobytes() for f in frames)


@test(input="frames [b'ab', b'', b'xyz'] into bytearray(32)")
def layout(impl):
    frames = [b"ab", b"", b"xyz"]
    chunk = bytearray(32)
    check_equal(impl.pack_into(chunk, frames), True, "pack_into's result for a message that fits")
    want = _packed(frames)
    if bytes(chunk[:len(want)]) != want:
        raise Fail("the packed bytes are wrong (byte 0, u16 LE count, u32 LE lengths, data)",
                   expected=want, got=bytes(chunk[:len(want)]), input="[b'ab', b'', b'xyz']")
    check_equal(impl.unpack(chunk), frames, "unpack of that chunk")


@test(input="chunks of 64 bytes; messages of exactly 64 and of 65 packed bytes")
def exact_fit(impl):
    check_equal(impl.packed_size([b"ab", b"xyz"]), 3 + 8 + 5, "packed_size([b'ab', b'xyz'])")
    exact = [bytes(64 - 3 - 4)]  # one frame: header 3 + length 4 + 57 bytes = 64
    check_equal(impl.fits(exact, 64), True, "fits(one 57-byte frame, 64): it fills the chunk exactly")
    chunk = bytearray(64)
    check_equal(impl.pack_into(chunk, exact), True, "pack_into of a message that fills the chunk")
    check_equal(impl.unpack(chunk), exact, "unpack of the exactly full chunk")
    big = [bytes(58)]
    check_equal(impl.fits(big, 64), False, "fits(one 58-byte frame, 64)")
    chunk = bytearray(64)
    check_equal(impl.pack_into(chunk, big), False, "pack_into of a message one byte too big")
    check_equal(chunk[0], 1, "byte 0 after an overflow (the OVERFLOW marker)")
    check_equal(impl.unpack(chunk), None, "unpack of an overflow marker")


@test(input="frames: memoryview(array('i', range(10))) (40 bytes, 10 items) and b'z'")
def multibyte_frames(impl):
    ints = array.array("i", range(10))
    frames = [memoryview(ints), b"z"]
    check_equal(impl.packed_size(frames), 3 + 8 + 41, "packed_size: a frame's size is its bytes, "
                "not len() (which counts the 10 items)")
    chunk = memoryview(bytearray(128))
    check_equal(impl.pack_into(chunk, frames), True, "pack_into into a memoryview chunk")
    want = _packed(frames)
    if bytes(chunk[:len(want)]) != want:
        raise Fail("the packed bytes are wrong for a multi-byte frame",
                   expected=want, got=bytes(chunk[:len(want)]))
    got = impl.unpack(chunk)
    check_equal([bytes(f) for f in got], [ints.tobytes(), b"z"], "unpack of the multi-byte frames")


@test(input="unpack a chunk, then overwrite the chunk with the next message")
def copy_out(impl):
    chunk = memoryview(bytearray(64))
    impl.pack_into(chunk, [b"first message"])
    frames = impl.unpack(chunk)
    impl.pack_into(chunk, [b"SECOND MESSAGE"])
    got = [bytes(f) for f in frames]
    if got != [b"first message"]:
        raise Fail("the frames unpack returned changed when the writer reused the chunk: they are "
                   "views of the chunk, not copies (use bytes(chunk[a:b]))",
                   expected=[b"first message"], got=got)


@test(input="70,000 empty frames, a 1 MiB chunk")
def too_many_frames(impl):
    frames = [b""] * 70_000
    check_equal(impl.fits(frames, 1 << 20), False, "fits(70,000 frames): the count is a u16 (<= 65,535)")
    chunk = bytearray(1 << 20)
    check_equal(impl.pack_into(chunk, frames), False, "pack_into(70,000 frames)")
    check_equal(chunk[0], 1, "byte 0 after that overflow")


def _messages(count: int, chunk_bytes: int) -> list[list[bytes]]:
    rng = random.Random(214)
    sizes = [0, 1, 17, chunk_bytes // 3, chunk_bytes - 11, chunk_bytes * 2]
    return [[rng.randbytes(rng.choice(sizes)) for _ in range(rng.choice([1, 1, 2, 3]))]
            for _ in range(count)]


def _reader(impl, name, n_chunks, chunk_bytes, count, pipe, report):
    from minivllm.distributed.shm_ring import ShmRingBuffer
    import time

    ring, problem = ShmRingBuffer(1, chunk_bytes, n_chunks, name=name), None
    for i, want in enumerate(_messages(count, chunk_bytes)):
        idx, deadline = i % n_chunks, time.monotonic() + RING_WAIT_S
        while not ring.readable(idx, 0) and time.monotonic() < deadline:
            time.sleep(0.0001)
        view = ring.chunk(idx)
        try:
            frames = impl.unpack(view)
        finally:
            view.release()
        ring.end_read(idx, 0)
        if frames is None:
            frames = pipe.recv() if pipe.poll(RING_WAIT_S) else "nothing on the pipe"
        if [bytes(f) for f in frames] != want:
            problem = (i, [len(f) for f in frames], [len(f) for f in want])
            break
    ring.close()
    report.send(problem)


@test(input="ShmRingBuffer(1 reader, 4 chunks of 256 B), 500 messages, about 1 in 6 overflows",
      timeout=30, hang="the writer or the reader waited for a chunk that never changed state")
def through_the_ring(impl):
    import time

    from minivllm.distributed.shm_ring import ShmRingBuffer

    n_chunks, chunk_bytes, count = 4, 256, 500
    ring = ShmRingBuffer(1, chunk_bytes, n_chunks)
    ctx = mp.get_context("fork")
    pipe_rx, pipe_tx = ctx.Pipe(duplex=False)
    report_rx, report_tx = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_reader, args=(impl, ring.name, n_chunks, chunk_bytes, count,
                                              pipe_rx, report_tx))
    proc.start()
    try:
        for i, frames in enumerate(_messages(count, chunk_bytes)):
            idx, deadline = i % n_chunks, time.monotonic() + RING_WAIT_S
            while not ring.writable(idx):
                if time.monotonic() > deadline or not proc.is_alive():
                    raise Fail(f"the reader stopped reading at message {i - n_chunks}")
                time.sleep(0.0001)
            view = ring.begin_write(idx)
            try:
                packed = impl.pack_into(view, frames)
            finally:
                view.release()
            ring.end_write(idx)
            if not packed:
                pipe_tx.send(frames)
        problem = report_rx.recv() if report_rx.poll(RING_WAIT_S) else "no report from the reader"
    finally:
        proc.join(RING_WAIT_S)
        if proc.is_alive():
            proc.kill()
            proc.join()
        ring.close()
    if problem is not None:
        if isinstance(problem, str):
            raise Fail(problem)
        i, got, want = problem
        raise Fail(f"message {i} arrived wrong (frame lengths shown)", expected=want, got=got,
                   input=f"{count} messages through a {n_chunks}-chunk ring")
