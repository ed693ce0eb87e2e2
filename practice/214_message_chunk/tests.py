"""The judge's tests for exercise 214. Each receives the learner's module as `impl`."""

from __future__ import annotations

import array
import multiprocessing as mp
import random
import re

from minivllm.judge.api import Fail, check_equal, kill_if_alive, scaled, step, test
from minivllm.judge.properties import for_all, st

RING_WAIT_S = scaled(10.0)  # a chunk not written or read in this long means a protocol bug
PROPERTY_EXAMPLES = 300  # (frames, chunk size) pairs hypothesis draws: the same on every run
# 0-6 frames of 0-40 bytes into a chunk of 1-120 bytes: about as many fit as overflow, and the
# exact fit and one byte short are among what hypothesis tries
MESSAGES = st.tuples(st.lists(st.binary(max_size=40), max_size=6), st.integers(1, 120))


def _packed(frames) -> bytes:
    """The expected bytes, written out independently of the learner's code."""
    out = bytes([0]) + len(frames).to_bytes(2, "little")
    out += b"".join(memoryview(f).nbytes.to_bytes(4, "little") for f in frames)
    return out + b"".join(memoryview(f).cast("B").tobytes() for f in frames)


@test(input="frames [b'ab', b'', b'xyz'] into bytearray(32)")
def layout(impl):
    frames = [b"ab", b"", b"xyz"]
    chunk = bytearray(32)
    step("pack_into(bytearray(32), [b'ab', b'', b'xyz'])")
    check_equal(impl.pack_into(chunk, frames), True, "pack_into's result for a message that fits")
    want = _packed(frames)
    if bytes(chunk[:len(want)]) != want:
        raise Fail("the packed bytes are wrong (byte 0, u16 LE count, u32 LE lengths, data)",
                   expected=want, got=bytes(chunk[:len(want)]), input="[b'ab', b'', b'xyz']")
    step("unpack(the chunk pack_into wrote)")
    check_equal(impl.unpack(chunk), frames, "unpack of that chunk")


@test(input="chunks of 64 bytes; messages of exactly 64 and of 65 packed bytes; a message of 0 "
      "frames in a 3-byte chunk (and fits() of it for 2 bytes); then "
      f"{PROPERTY_EXAMPLES} messages (0-6 frames of 0-40 bytes) and chunk sizes (1-120) drawn by "
      "hypothesis, against the judge's own writer", timeout=30)
def exact_fit(impl):
    step("packed_size([b'ab', b'xyz'])")
    check_equal(impl.packed_size([b"ab", b"xyz"]), 3 + 8 + 5, "packed_size([b'ab', b'xyz'])")
    exact = [bytes(64 - 3 - 4)]  # one frame: header 3 + length 4 + 57 bytes = 64
    step("fits, pack_into and unpack of one 57-byte frame, 64-byte chunk (fills it exactly)")
    check_equal(impl.fits(exact, 64), True, "fits(one 57-byte frame, 64): it fills the chunk exactly")
    chunk = bytearray(64)
    check_equal(impl.pack_into(chunk, exact), True, "pack_into of a message that fills the chunk")
    check_equal(impl.unpack(chunk), exact, "unpack of the exactly full chunk")
    big = [bytes(58)]
    step("fits and pack_into of one 58-byte frame, 64-byte chunk of 0xee (one byte too big)")
    check_equal(impl.fits(big, 64), False, "fits(one 58-byte frame, 64)")
    chunk = bytearray(b"\xee" * 64)
    check_equal(impl.pack_into(chunk, big), False, "pack_into of a message one byte too big")
    check_equal(chunk[0], 1, "byte 0 after an overflow (the OVERFLOW marker)")
    if chunk[1:] != b"\xee" * 63:
        raise Fail("an overflow must write only byte 0 (the marker); pack_into also changed "
                   "bytes 1..63 of a chunk that held 0xee", expected=b"\xee" * 8,
                   got=bytes(chunk[1:9]), input="one 58-byte frame into a 64-byte chunk")
    step("unpack(the overflowed chunk)")
    check_equal(impl.unpack(chunk), None, "unpack of an overflow marker")
    step("fits([], 2), then pack_into and unpack of [] in a 3-byte chunk")
    check_equal(impl.fits([], 2), False, "fits(no frames, 2): the 3-byte header alone does not fit")
    chunk = bytearray(3)  # an empty message: the header alone fills a 3-byte chunk
    check_equal(impl.pack_into(chunk, []), True, "pack_into of no frames into a 3-byte chunk")
    check_equal(bytes(chunk), b"\x00\x00\x00", "the packed bytes of no frames")
    check_equal(impl.unpack(chunk), [], "unpack of a message of 0 frames (not an overflow)")
    step(f"{PROPERTY_EXAMPLES} (frames, chunk_bytes) drawn by hypothesis")
    for_all(MESSAGES, lambda drawn: _packs_as_the_judge(impl, *drawn),
            examples=PROPERTY_EXAMPLES, what="(frames, chunk_bytes)")


def _packs_as_the_judge(impl, frames: list[bytes], chunk_bytes: int) -> None:
    """packed_size, fits and pack_into agree with the judge's writer; a chunk the judge packed
    unpacks to the frames; an overflow writes byte 0 alone."""
    want = _packed(frames)
    check_equal(impl.packed_size(frames), len(want), "packed_size (header, lengths and data)")
    check_equal(impl.fits(frames, chunk_bytes), len(want) <= chunk_bytes,
                f"fits(frames, {chunk_bytes}) for {len(want)} packed bytes")
    chunk = bytearray(chunk_bytes)
    packed = impl.pack_into(chunk, frames)
    check_equal(packed, len(want) <= chunk_bytes, f"pack_into's result for {len(want)} packed "
                f"bytes in a {chunk_bytes}-byte chunk")
    if packed and bytes(chunk[:len(want)]) != want:
        raise Fail("the packed bytes are wrong (byte 0, u16 LE count, u32 LE lengths, data)",
                   expected=want, got=bytes(chunk[:len(want)]))
    if not packed and bytes(chunk) != b"\x01" + bytes(chunk_bytes - 1):
        raise Fail("an overflow must write only byte 0 (the marker)", expected=b"\x01",
                   got=bytes(chunk[:16]))
    if len(want) <= chunk_bytes:
        got = impl.unpack(bytearray(want + bytes(chunk_bytes - len(want))))
        check_equal([bytes(f) for f in got], frames, "unpack of the judge's packed chunk")


@test(input="frames: memoryview(array('i', range(10))) (40 bytes, 10 items) and b'z'; then "
      "2-D memoryviews: bytes shaped (3, 4) and int32 shaped (2, 3), and signed bytes ('b'), into "
      "a memoryview chunk")
def multibyte_frames(impl):
    ints = array.array("i", range(10))
    frames = [memoryview(ints), b"z"]
    step("packed_size([memoryview(array('i', range(10))), b'z'])")
    check_equal(impl.packed_size(frames), 3 + 8 + 41, "packed_size: a frame's size is its bytes, "
                "not len() (which counts the 10 items)")
    chunk = memoryview(bytearray(128))
    step("pack_into(memoryview(bytearray(128)), [memoryview(array('i', range(10))), b'z'])")
    check_equal(impl.pack_into(chunk, frames), True, "pack_into into a memoryview chunk")
    want = _packed(frames)
    if bytes(chunk[:len(want)]) != want:
        raise Fail("the packed bytes are wrong for a multi-byte frame",
                   expected=want, got=bytes(chunk[:len(want)]))
    step("unpack(that chunk)")
    got = impl.unpack(chunk)
    check_equal([bytes(f) for f in got], [ints.tobytes(), b"z"], "unpack of the multi-byte frames")
    two_d = [memoryview(bytearray(range(12))).cast("B", (3, 4)),
             memoryview(array.array("i", range(6))).cast("B").cast("i", (2, 3)),
             memoryview(array.array("b", [-1, 2, -3]))]  # 1-byte items, but signed: not "B"
    chunk = memoryview(bytearray(64))  # a memoryview, like a shared-memory chunk
    step("pack_into(memoryview(bytearray(64)), [bytes shaped (3, 4), int32 shaped (2, 3), "
         "array('b', [-1, 2, -3])])")
    try:
        packed = impl.pack_into(chunk, two_d)
    except (TypeError, ValueError, NotImplementedError) as e:
        raise Fail("pack_into cannot write a 2-D memoryview frame (or a signed-byte 'b' one) "
                   "into a memoryview chunk: cast every frame to flat bytes with "
                   "memoryview(frame).cast('B'), whatever its format and shape",
                   expected="True", got=f"{type(e).__name__}: {e}") from None
    check_equal(packed, True, "pack_into of two 2-D frames and a 'b' frame (12 + 24 + 3 bytes)")
    want = _packed(two_d)
    check_equal(bytes(chunk[:len(want)]), want, "the packed bytes of two 2-D frames and a 'b' one")


@test(input="unpack a chunk, then overwrite the chunk with the next message")
def copy_out(impl):
    chunk = memoryview(bytearray(64))
    step("pack_into(chunk, [b'first message']), then unpack(chunk)")
    impl.pack_into(chunk, [b"first message"])
    frames = impl.unpack(chunk)
    step("pack_into(the same chunk, [b'SECOND MESSAGE'])")
    impl.pack_into(chunk, [b"SECOND MESSAGE"])
    got = [bytes(f) for f in frames]
    if got != [b"first message"]:
        raise Fail("the frames unpack returned changed when the writer reused the chunk: they are "
                   "views of the chunk, not copies (use bytes(chunk[a:b]))",
                   expected=[b"first message"], got=got)


def _header(lengths) -> bytes:
    return bytes([0]) + len(lengths).to_bytes(2, "little") + b"".join(
        n.to_bytes(4, "little") for n in lengths)


UNSIGNED = ("The lengths are unsigned u32 ('<I'): 0xffffffff is 4,294,967,295 bytes; read as "
            "signed ('<i') it is -1, and the frames come out of the wrong bytes")
PAST_END = ("slicing past a buffer's end gives a short frame, not an error: compare each "
            "frame's end (offset + length) with the chunk's size")
# the plain end checks first: a learner who never checks is told that, not about signedness
TORN = [(_header([58]), "1 frame of 58 bytes: 3 + 4 + 58 = 65, one byte past the end (count "
                        "the header and the lengths too). " + PAST_END),
        (_header([30, 30]), "2 frames of 30 bytes: each alone fits, together 3 + 8 + 60 = 71 "
                            "bytes reach past the end (check the running offset, every frame)"),
        (b"\x00\xff\xff", "a count of 65,535 frames: their lengths alone (4 bytes each) reach "
                           "past the end (check that before struct.unpack_from, which raises "
                           "struct.error)"),
        (_header([0x8000_0005]), "1 frame of length 0x80000005. " + UNSIGNED),
        (_header([5, 0xFFFF_FFFF]), "2 frames of lengths 5 and 0xffffffff. " + UNSIGNED)]


@test(input="64-byte chunks with crafted headers: 1 frame of 57 (it fits); then 1 frame of 58 "
            "(one byte past the end); 2 frames of 30 (together past the end); a count of 65,535 "
            "(the lengths alone reach past it); 1 frame of length 0x80000005; 2 frames of "
            "lengths 5 and 0xFFFFFFFF")
def lengths_are_unsigned(impl):
    ok = _packed([bytes(range(57))])  # 3 + 4 + 57 = 64 bytes: fills the chunk exactly
    step("unpack(a 64-byte chunk holding 1 frame of 57 bytes)")
    check_equal(impl.unpack(bytearray(ok)), [bytes(range(57))], "unpack of a full 64-byte chunk")
    for header, what in TORN:
        chunk = bytearray(header + bytes(64 - len(header)))
        step(f"unpack(a 64-byte chunk whose header gives {what.split(':')[0].split('.')[0]})")
        try:
            got = impl.unpack(chunk)
        except ValueError as e:
            if "64" in re.findall(r"\d+", str(e)):
                continue
            raise Fail("unpack's ValueError for a 64-byte chunk whose header gives "
                       f"{what.split('.')[0]} does not give the chunk's size: the README "
                       "requires the message to say how many bytes the chunk has",
                       expected="a message naming 64", got=repr(str(e)),
                       input=f"header {header.hex(' ')}, then zeros up to 64 bytes") from None
        except Exception as e:  # struct.error, IndexError...: a crash, not the error asked for
            got = f"{type(e).__name__}: {e}"
        raise Fail(f"unpack of a 64-byte chunk whose header gives {what}: it must raise "
                   "ValueError, because the lengths reach past the chunk's end",
                   expected="ValueError", got=got,
                   input=f"header {header.hex(' ')}, then zeros up to 64 bytes")


@test(input="65,535 empty frames (the most a u16 counts), then 65,536 and 70,000, a 1 MiB chunk")
def too_many_frames(impl):
    most = [b""] * 65_535
    step("fits, pack_into and unpack of 65,535 empty frames, a 1 MiB chunk")
    check_equal(impl.fits(most, 1 << 20), True, "fits(65,535 frames): the u16 count holds 65,535")
    chunk = bytearray(1 << 20)
    check_equal(impl.pack_into(chunk, most), True, "pack_into(65,535 empty frames)")
    check_equal(bytes(chunk[:3]), b"\x00\xff\xff", "byte 0 and the u16 count for 65,535 frames")
    check_equal(len(impl.unpack(chunk)), 65_535, "frames unpacked from a chunk whose u16 count is "
                "65,535 (bytes 1..2 read as unsigned little-endian)")
    for n in (65_536, 70_000):
        frames = [b""] * n
        step(f"fits and pack_into of {n:,} empty frames, a 1 MiB chunk")
        check_equal(impl.fits(frames, 1 << 20), False, f"fits({n:,} frames): the count is a u16 "
                    "(<= 65,535)")
        chunk = bytearray(1 << 20)
        check_equal(impl.pack_into(chunk, frames), False, f"pack_into({n:,} frames)")
        check_equal(chunk[0], 1, f"byte 0 after the overflow of {n:,} frames")


def _messages(count: int, chunk_bytes: int) -> list[list[bytes]]:
    rng = random.Random(214)
    sizes = [0, 1, 17, chunk_bytes // 3, chunk_bytes - 11, chunk_bytes * 2]
    return [[rng.randbytes(rng.choice(sizes)) for _ in range(rng.choice([1, 1, 2, 3]))]
            for _ in range(count)]


def _reader(impl, name, n_chunks, chunk_bytes, count, pipe, status, report):
    from minivllm.distributed.shm_ring import ShmRingBuffer
    import time

    ring, problem = ShmRingBuffer(1, chunk_bytes, n_chunks, name=name), None
    for i, want in enumerate(_messages(count, chunk_bytes)):
        idx, deadline = i % n_chunks, time.monotonic() + RING_WAIT_S
        while not ring.readable(idx, 0):
            if time.monotonic() > deadline:
                problem = f"the reader waited {RING_WAIT_S:.0f} s for message {i} in chunk {idx}"
                break
            time.sleep(0.0001)
        if problem:
            break
        view = ring.chunk(idx)
        try:
            frames = impl.unpack(view)
        finally:
            view.release()
        ring.end_read(idx, 0)
        marker = frames is None
        if not status.poll(RING_WAIT_S):  # the judge's writer sends it after every end_write
            problem = f"no pack_into result from the writer for message {i}"
            break
        packed = status.recv()  # what pack_into returned
        if marker and packed:
            problem = (i, [], [len(f) for f in want], marker)
            break
        if marker:
            frames = pipe.recv() if pipe.poll(RING_WAIT_S) else "nothing on the pipe"
        if [bytes(f) for f in frames] != want:
            problem = (i, [len(f) for f in frames], [len(f) for f in want], marker)
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
    status_rx, status_tx = ctx.Pipe(duplex=False)  # the judge's own: pack_into's result per message
    proc = ctx.Process(target=_reader, args=(impl, ring.name, n_chunks, chunk_bytes, count,
                                              pipe_rx, status_rx, report_tx))
    proc.start()
    try:
        overflowed = set()
        for i, frames in enumerate(_messages(count, chunk_bytes)):
            idx, deadline = i % n_chunks, time.monotonic() + RING_WAIT_S
            while not ring.writable(idx) and not report_rx.poll():  # a report: the reader is done
                stopped = time.monotonic() > deadline or not proc.is_alive()
                if stopped and not report_rx.poll():  # it reports before it exits
                    raise Fail(f"the reader stopped reading at message {i - n_chunks}")
                time.sleep(0.0001)
            if report_rx.poll():
                break
            view = ring.begin_write(idx)
            try:
                packed = impl.pack_into(view, frames)
            finally:
                view.release()
            ring.end_write(idx)
            status_tx.send(packed)
            if not packed:
                overflowed.add(i)
                pipe_tx.send(frames)
        problem = report_rx.recv() if report_rx.poll(RING_WAIT_S) else "no report from the reader"
    finally:
        proc.join(RING_WAIT_S)
        kill_if_alive(proc)
        ring.close()
    if problem is not None:
        if isinstance(problem, str):
            raise Fail(problem)
        i, got, want, marker = problem
        where = f"{count} messages through a {n_chunks}-chunk ring, chunk {i % n_chunks}"
        if marker and i not in overflowed:
            raise Fail(f"message {i}: pack_into returned True, but the reader found the OVERFLOW "
                       "marker in byte 0: a chunk reused after an overflow must get byte 0 = 0 "
                       "again when a message fits", expected=want, got=got, input=where)
        raise Fail(f"message {i} arrived wrong (frame lengths shown)", expected=want, got=got,
                   input=where)
