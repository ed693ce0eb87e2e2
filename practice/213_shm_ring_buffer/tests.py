"""The judge's tests for exercise 213. Each receives the learner's module as `impl`."""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import sys
import time

from minivllm.judge import procfs
from minivllm.judge.api import Fail, check_equal, learner_frame, scaled, step, test
from minivllm.judge.interleave import InstrumentedBuffer, Violation, explore

PROCESS_WAIT_S = scaled(20.0)  # a message not delivered in this long means a lost flag, not slowness
HEADER = 4
# Schedules per interleaving scenario. The reference solution needs at most ~3,000; a ring
# that needs more makes far more buffer accesses than the protocol does (byte-by-byte copies).
MAX_RUNS = 30_000


# --- the layout from README.md, as the judge sees it, written independently of any ring ----
def meta_base(n_chunks, chunk_bytes):
    return n_chunks * chunk_bytes


def label_for(n_readers, n_chunks, chunk_bytes):
    """Names bytes of the buffer: label(off) one byte ('chunk 1 read flag of reader 0', 'chunk 0
    length header'), label(start, stop) the bytes of one access ('chunk 0 read flags of readers
    0-1', 'chunk 2 payload')."""
    base = meta_base(n_chunks, chunk_bytes)

    def place(off):  # (chunk, 'data' or 'meta', the byte's index in its chunk or meta row)
        if off < base:
            return off // chunk_bytes, "data", off % chunk_bytes
        chunk, k = divmod(off - base, 1 + n_readers)
        return chunk, "meta", k

    def one(off):
        chunk, area, i = place(off)
        if area == "data":
            return f"chunk {chunk} " + ("length header" if i == 0 else f"length header byte {i}"
                                        if i < HEADER else "payload" if i == HEADER
                                        else f"payload byte {i - HEADER}")
        return f"chunk {chunk} written flag" if i == 0 else f"chunk {chunk} read flag of reader {i - 1}"

    def label(start, stop=None):
        last = start if stop is None or stop <= start + 1 else stop - 1
        (chunk, area, i), (chunk2, area2, j) = place(start), place(last)
        if last == start or (chunk, area) != (chunk2, area2):
            return one(start) if last == start else f"{one(start)} .. {one(last)}"
        if area == "meta":  # the written flag is byte 0 of the row, reader k's flag byte 1 + k
            first, end = max(i, 1) - 1, j - 1
            flags = (f"read flag of reader {first}" if first == end
                     else f"read flags of readers {first}-{end}")
            return f"chunk {chunk} " + ("written flag and " if i == 0 else "") + flags
        if j < HEADER:
            return f"chunk {chunk} length header" + ("" if (i, j) == (0, HEADER - 1)
                                                     else f" bytes {i}-{j}")
        if i >= HEADER:
            return f"chunk {chunk} payload" + ("" if i == HEADER else f" bytes {i - HEADER}-"
                                               f"{j - HEADER}")
        return f"chunk {chunk} length header and payload"
    return label


def ref_write(buf, n, c, b, index, payload) -> None:
    """The judge's own writer, straight from README.md's table."""
    start, meta = index * b, meta_base(c, b) + index * (1 + n)
    buf[start:start + HEADER] = len(payload).to_bytes(HEADER, "little")
    buf[start + HEADER:start + HEADER + len(payload)] = payload
    buf[meta + 1:meta + 1 + n] = bytes(n)
    buf[meta] = 1


def ref_read(buf, n, c, b, index, reader) -> bytes | None:
    """The judge's own reader."""
    start, meta = index * b, meta_base(c, b) + index * (1 + n)
    if not buf[meta] or buf[meta + 1 + reader]:
        return None
    size = int.from_bytes(buf[start:start + HEADER], "little")
    payload = bytes(buf[start + HEADER:start + HEADER + size])
    buf[meta + 1 + reader] = 1
    return payload


def first_difference(got: bytes, want: bytes, label) -> str:
    i = next(i for i in range(len(want)) if got[i] != want[i])
    return f"byte {i} ({label(i)}) is {got[i]}, the layout says {want[i]}"


@test(input="n_readers=2, n_chunks=4, chunk_bytes=64, and n_readers=3, n_chunks=2, chunk_bytes=32")
def layout(impl):
    for n, c, b in [(2, 4, 64), (3, 2, 32)]:
        where = f"n_readers={n}, n_chunks={c}, chunk_bytes={b}"
        step(f"buffer_size and the offsets for {where}")
        check_equal(impl.buffer_size(n, c, b), c * b + c * (1 + n), "buffer_size", where)
        for i in range(c):
            check_equal(impl.chunk_offset(i, b), i * b, f"chunk_offset(chunk={i})", where)
            w = meta_base(c, b) + i * (1 + n)
            check_equal(impl.written_flag_offset(i, n, c, b), w, f"written_flag_offset(chunk={i})", where)
            for r in range(n):
                check_equal(impl.read_flag_offset(i, r, n, c, b), w + 1 + r,
                            f"read_flag_offset(chunk={i}, reader={r})", where)


class _LineBudget:
    """While active, counts the lines the learner's module runs in this thread and fails once
    they pass `limit`: the few non-waiting calls of a test run a few hundred lines, so a call
    that keeps running is waiting inside (a loop until a chunk frees), named at once instead
    of by the time limit."""

    def __init__(self, impl, limit: int = 200_000) -> None:
        self.file, self.left, self.limit = impl.__file__, limit, limit

    def _enter_frame(self, frame, event, arg):
        return self._line if frame.f_code.co_filename == self.file else None

    def _line(self, frame, event, arg):
        if event == "line":
            self.left -= 1
            if self.left < 0:
                sys.settrace(None)
                raise Fail(f"{frame.f_code.co_name}() ran {self.limit:,} lines of your code "
                           "without returning: it waits inside for the ring to change, which "
                           "no other thread will do here. Neither side ever waits: try_write "
                           "returns False on a full chunk, try_read None when nothing is new")
        return self._line

    def __enter__(self):
        sys.settrace(self._enter_frame)
        return self

    def __exit__(self, *exc):
        sys.settrace(None)


def _stayed(side, index: int, what: str) -> None:
    """The README: each side moves to the next chunk only after it wrote or read one."""
    if side.index != index:
        raise Fail(f"{what}, but it moved its current chunk from {index} to {side.index}: a "
                   "side moves on only after it wrote or read its chunk; a writer that moves on "
                   "after a failed write skips that chunk, and its readers wait there forever",
                   expected=f"index {index}", got=f"index {side.index}")


@test(input="2 readers, 3 chunks of 16 bytes, one thread, a plain bytearray; then 1 reader, 1 "
      "chunk, a memoryview buffer (as shm.buf is)",
      hang="try_write or try_read must return at once (False / None) instead of waiting.")
def write_then_read(impl):
    with _LineBudget(impl):
        _write_then_read(impl)


def _write_then_read(impl):
    n, c, b = 2, 3, 16
    buf = bytearray(c * b + c * (1 + n))
    writer = impl.RingWriter(buf, n, c, b)
    readers = [impl.RingReader(buf, r, n, c, b) for r in range(n)]
    label = label_for(n, c, b)
    msgs = [b"m0", b"", bytes(range(12))]  # the last one fills a chunk exactly
    step("try_read of each reader on an empty ring")
    check_equal([r.try_read() for r in readers], [None, None], "try_read on an empty ring")
    _stayed(readers[0], 0, "try_read found nothing new (an empty ring)")
    for i, m in enumerate(msgs):
        step(f"try_write(message {i}: {m!r}) into a free chunk")
        check_equal(writer.try_write(m), True, f"try_write(message {i}) into a free chunk")
        w = meta_base(c, b) + i * (1 + n)
        check_equal(buf[w], 1, f"the {label(w)} after writing it")
    step("try_write(b'x') into a full ring (nobody has read)")
    check_equal(writer.try_write(b"x"), False, "try_write into a full ring (nobody has read)")
    _stayed(writer, 0, "try_write returned False (chunk 0 is full)")
    for r, reader in enumerate(readers):
        for i, m in enumerate(msgs):
            step(f"reader {r}'s try_read of message {i}")
            check_equal(reader.try_read(), m, f"reader {r}'s message {i}")
        step(f"reader {r}'s try_read after it read all {c} (nothing new)")
        again = reader.try_read()
        if again is not None:
            raise Fail(f"reader {r} read a message a second time on its next lap: after copying a "
                       "chunk out, a reader must set its own read flag, so that it skips the chunk "
                       "until the writer refills it (and so that the writer may refill it)",
                       expected=None, got=again, input=f"try_read after reader {r} read all {c}")
        _stayed(reader, 0, f"reader {r}'s try_read found nothing new (chunk 0 already read)")
    shm_like = memoryview(bytearray(16 + 2))  # shm.buf is a memoryview: its slices are views
    writer, reader = impl.RingWriter(shm_like, 1, 1, 16), impl.RingReader(shm_like, 0, 1, 1, 16)
    step("a memoryview buffer, 1 reader, 1 chunk: try_write(b'first'), try_read, "
         "try_write(b'SECOND')")
    writer.try_write(b"first")
    first = reader.try_read()
    writer.try_write(b"SECOND")  # the chunk is consumed: the writer refills it
    if first is None or bytes(first) != b"first":
        raise Fail("a message try_read returned changed when the writer refilled its chunk: "
                   "copy the payload out (bytes(buf[a:b])); a slice of shared memory is a view",
                   expected=b"first", got=None if first is None else bytes(first),
                   input="a memoryview buffer, 1 reader, 1 chunk: write, read, write again")


@test(input="3 readers, 3 chunks of 16 bytes: your writer against the judge's reader, "
            "the judge's writer against your readers, byte for byte")
def wire_format(impl):
    """The exact bytes of README.md's layout: a ring that is consistent with itself but not
    with the table (flags in another order, a big-endian length) breaks against another
    implementation, as vLLM's writer and readers in different processes would."""
    n, c, b = 3, 3, 16
    label, size = label_for(n, c, b), c * b + c * (1 + n)
    msgs = [b"", b"\x01\x02\x03", bytes(range(100, 100 + b - HEADER))]
    mine, want = bytearray(size), bytearray(size)
    writer = impl.RingWriter(mine, n, c, b)
    for i, m in enumerate(msgs):
        step(f"your try_write of message {i} ({m!r}), compared with the judge's writer")
        writer.try_write(m)
        ref_write(want, n, c, b, i, m)
        if mine != want:
            raise Fail(f"after your try_write of message {i} ({m!r}), "
                       + first_difference(mine, want, label), input=f"messages {msgs}")
    order = [(1, 0), (1, 1), (2, 0), (0, 0), (0, 1), (1, 2), (0, 2), (2, 1), (2, 2)]
    readers = [impl.RingReader(want, r, n, c, b) for r in range(n)]
    expected = bytearray(want)
    for r, i in order:  # reader 1 first: a ring that numbers its flags backwards shows here
        step(f"your reader {r}'s try_read of message {i}, from the judge's writer")
        got = readers[r].try_read()
        check_equal(got, msgs[i], f"reader {r}'s message {i} from the judge's writer",
                    input=f"the judge wrote {msgs}; readers read in the order (reader, message) {order}")
        ref_read(expected, n, c, b, i, r)
        if want != expected:
            raise Fail(f"after reader {r} read message {i}, "
                       + first_difference(want, expected, label), input=f"messages {msgs}")


@test(input="chunk_bytes=16: payloads of 0, 11, 12 and 13 bytes, the next chunk and the flags "
            "filled with 0xEE")
def payload_sizes(impl):
    """Every boundary: a payload of chunk_bytes - 4 bytes fills a chunk exactly; one more byte
    would overwrite the next chunk's length header (or the flags after the last chunk)."""
    n, c, b = 1, 2, 16
    label, size = label_for(n, c, b), c * b + c * (1 + n)
    for index in (0, 1):
        for length in (0, b - HEADER - 1, b - HEADER, b - HEADER + 1):
            buf = bytearray(b"\xee" * size)
            start, meta = index * b, meta_base(c, b) + index * (1 + n)
            buf[start:start + b] = bytes(b)
            buf[meta:meta + 1 + n] = bytes(1 + n)
            writer = impl.RingWriter(buf, n, c, b)
            writer.index = index
            want = bytearray(buf)
            payload = bytes(range(1, length + 1))
            where = f"try_write of {length} bytes into chunk {index} (chunk_bytes={b})"
            step(where)
            try:
                writer.try_write(payload)
            except ValueError:
                if length <= b - HEADER:
                    raise Fail(f"a {length}-byte payload fits a chunk of {b} bytes (4 of them "
                               "the length header), but your try_write raised ValueError",
                               input=where)
                if buf != want:
                    raise Fail("try_write raised ValueError but had already written: "
                               + first_difference(buf, want, label), input=where)
                continue
            if length > b - HEADER:
                raise Fail(f"a payload larger than chunk_bytes - 4 = {b - HEADER} bytes must "
                           f"raise ValueError; yours was accepted", input=where)
            ref_write(want, n, c, b, index, payload)
            if buf != want:
                raise Fail("the chunk or the flags are wrong: " + first_difference(buf, want, label),
                           input=where)
            step(f"try_read of that chunk ({where})")
            reader = impl.RingReader(buf, 0, n, c, b)
            reader.index = index
            check_equal(reader.try_read(), payload, "what your reader got back", where)


def _scenario(impl, n_readers, n_chunks, msgs, bound):
    chunk_bytes = 8
    size = n_chunks * chunk_bytes + n_chunks * (1 + n_readers)
    got: list[list[bytes]] = []

    def make_bodies():
        shared = InstrumentedBuffer(size, label_for(n_readers, n_chunks, chunk_bytes))
        got.clear()
        got.extend([] for _ in range(n_readers))

        def writer_body(ctx):
            w = impl.RingWriter(shared.bind(ctx), n_readers, n_chunks, chunk_bytes)
            for m in msgs:
                mark, before = ctx.checkpoint(), dict(vars(w))
                while not w.try_write(m):
                    if w.index != before["index"]:
                        raise Violation(f"try_write returned False and moved from chunk "
                                        f"{before['index']} to {w.index}: the message it did not "
                                        "write skips that chunk")
                    ctx.block(since=mark if vars(w) == before else None)
                    mark, before = ctx.checkpoint(), dict(vars(w))
                ctx.note(f"wrote {m!r}")

        def reader_body(r):
            def body(ctx):
                rd = impl.RingReader(shared.bind(ctx), r, n_readers, n_chunks, chunk_bytes)
                for k in range(len(msgs)):
                    mark, before = ctx.checkpoint(), dict(vars(rd))
                    m = rd.try_read()
                    while m is None:
                        if rd.index != before["index"]:
                            raise Violation(f"try_read returned None and moved from chunk "
                                            f"{before['index']} to {rd.index}")
                        ctx.block(since=mark if vars(rd) == before else None)
                        mark, before = ctx.checkpoint(), dict(vars(rd))
                        m = rd.try_read()
                    ctx.note(f"received {m!r}")
                    got[r].append(m)
                    if m != msgs[k]:
                        seen = "a message it already had" if m in msgs[:k] else "a corrupted message"
                        raise Violation(f"received {m!r} as message {k}, expected {msgs[k]!r} "
                                        f"({seen})")
            return body
        return [writer_body] + [reader_body(r) for r in range(n_readers)]

    def final_check():
        for r, seq in enumerate(got):
            if seq != msgs:
                raise Violation(f"reader {r} received {seq}, expected {msgs}")

    names = ["writer"] + [f"reader {r}" for r in range(n_readers)]
    return explore(names, make_bodies, final_check, preemption_bound=bound, max_runs=MAX_RUNS)


# (readers, chunks, messages, preemption bound). With two chunks and three messages the writer
# laps the ring and refills chunk 0 while readers may still be on it; with three readers one
# chunk and two messages do the same, with a reader in the middle. The messages have different
# lengths (the last fills a chunk), so a length read at the wrong moment shows. Every schedule
# within the bound is explored, on every machine: the verdict never depends on speed.
MESSAGES = [b"m0", b"m1-", b"m2--"]
SCENARIOS = [(1, 2, 3, 2), (2, 2, 3, 2), (3, 1, 2, 1)]


@test(input="writer + readers as threads, every buffer access a possible switch", timeout=150,
      hang="The search is bounded by schedules, not seconds; on a very slow machine raise the "
           "time limit in this test, never the verdict.")
def interleavings(impl):
    explored = []
    for n_readers, n_chunks, n_msgs, bound in SCENARIOS:
        where = (f"{n_readers} reader(s), {n_chunks} chunk(s), messages {MESSAGES[:n_msgs]}, "
                 f"up to {bound} preemption(s)")
        step(f"every schedule of try_write and try_read threads: {where}")
        result = _scenario(impl, n_readers, n_chunks, MESSAGES[:n_msgs], bound)
        if result.failure:
            raise Fail(f"schedule {result.runs} of the search breaks the ring: "
                       f"{result.failure.failure}", input=where,
                       detail="The schedule that breaks it, step by step:\n" + result.timeline(last=32))
        if not result.finished:
            raise Fail(f"the search stopped after {result.runs:,} schedules without finishing, so "
                       "it proves nothing. Your try_write/try_read make many more buffer accesses "
                       "than the protocol needs: copy with one slice (buf[a:b]), read the flags "
                       "you need once.", input=where)
        explored.append(f"{result.runs:,}")
    return f"every schedule explored ({' + '.join(explored)} runs)"


@test(input="a ring created, attached by name, closed twice and unlinked")
def cleanup(impl):
    step("ShmRing(2, 4, 64), then ShmRing(2, 4, 64, name=owner.name)")
    owner = impl.ShmRing(2, 4, 64)
    name = owner.name.lstrip("/")
    other = impl.ShmRing(2, 4, 64, name=owner.name)
    if bytes(other.shm.buf[:impl.buffer_size(2, 4, 64)]) != bytes(impl.buffer_size(2, 4, 64)):
        raise Fail("a new ring must start zeroed (all flags 0)", input="ShmRing(2, 4, 64)")
    step("unlink() of the ring attached by name")
    other.unlink()  # the README: unlink() removes the segment only in the creator
    if not os.path.exists(f"/dev/shm/{name}"):
        owner.close()
        raise Fail(f"unlink() on a ring attached by name removed /dev/shm/{name}: only the "
                   "creator may unlink; a non-creator's unlink() removes the creator's segment "
                   "under every process that has yet to attach", input="ShmRing(2, 4, 64, "
                   "name=owner.name).unlink()")
    step("close() of both rings")
    other.close()
    owner.close()
    if not os.path.exists(f"/dev/shm/{name}"):
        raise Fail(f"the creator's close() removed /dev/shm/{name}: close() only unmaps the "
                   "segment in this process; a reader that attaches later must still find it "
                   "until the creator calls unlink()", input="owner.close()")
    if procfs.maps_shm(name):
        raise Fail(f"after close() this process still maps /dev/shm/{name}: close() must "
                   "unmap the segment (SharedMemory.close())")
    step("the creator's unlink()")
    owner.unlink()
    if os.path.exists(f"/dev/shm/{name}"):
        raise Fail(f"after unlink() /dev/shm/{name} still exists: the creator must unlink it")


def _messages(seed: int, count: int, max_len: int) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(rng.choice([0, 1, 7, max_len // 2, max_len - 1, max_len]))
            for _ in range(count)]


SLOW_EVERY, SLOW_S = 97, 0.02  # the slow reader's pauses: the writer must wait for it


def _reader_process(module_name, name, r, n, c, b, seed, count, slow, conn):
    try:
        problem = _read_all(__import__(module_name), name, r, n, c, b, seed, count, slow)
    except Exception as exc:  # reported at once: the writer stops instead of waiting for a flag
        impl_dir = os.path.dirname(sys.modules[module_name].__file__)  # imported before the fork
        problem = ("raised", f"{type(exc).__name__}: {exc}",
                   learner_frame(exc.__traceback__, impl_dir))
    conn.send(problem)
    conn.close()


def _read_all(impl, name, r, n, c, b, seed, count, slow):
    """Reads the count messages as reader r; returns None, or (index, got, expected)."""
    expected = _messages(seed, count, b - HEADER)
    shm_ring = impl.ShmRing(n, c, b, name=name)
    rd, problem = shm_ring.reader(r), None
    for k in range(count):
        if slow and k % SLOW_EVERY == SLOW_EVERY - 1:
            time.sleep(SLOW_S)
        deadline, m = time.monotonic() + PROCESS_WAIT_S, rd.try_read()
        while m is None and time.monotonic() < deadline:
            os.sched_yield()
            m = rd.try_read()
        if m != expected[k]:
            problem = (k, "nothing (timed out)" if m is None else m, expected[k])
            break
    shm_ring.close()
    return problem


@test(input="1, 2 and 4 reader processes (with 4, reader 1 falls behind now and then), "
            "3,000 messages of 0 to 60 bytes, 4 chunks of 64 bytes, the first 4 written before "
            "the readers attach",
      timeout=120, hang="A reader or the writer waited forever: a flag that is never set or reset.")
def processes(impl):
    ctx = mp.get_context("fork")
    c, b, count = 4, 64, 3000
    for n in (1, 2, 4):
        slow = 1 if n == 4 else -1  # a middle reader: a writer that checks only some flags fails
        owner = impl.ShmRing(n, c, b)
        pipes = [ctx.Pipe(duplex=False) for _ in range(n)]
        procs = [ctx.Process(target=_reader_process,
                             args=(impl.__name__, owner.name, r, n, c, b, n, count, r == slow,
                                   pipes[r][1]))
                 for r in range(n)]
        msgs, writer, lost = _messages(n, count, b - HEADER), owner.writer(), None
        for k in range(c):  # the ring is full before any reader attaches, as a late worker finds it
            if not writer.try_write(msgs[k]):
                raise Fail(f"try_write of message {k} into an empty ring returned False")
        for p in procs:
            p.start()
        for k, m in enumerate(msgs[c:], start=c):
            deadline = time.monotonic() + PROCESS_WAIT_S
            while not writer.try_write(m):
                if time.monotonic() > deadline or any(conn.poll() for conn, _ in pipes):
                    lost = k  # timed out, or a reader stopped early to report a problem
                    break
                os.sched_yield()
            if lost is not None:
                break
        reports = [conn.recv() if conn.poll(PROCESS_WAIT_S + 2) else "no report" for conn, _ in pipes]
        problems = [(r, rep) for r, rep in enumerate(reports) if rep is not None]
        problems.sort(key=lambda p: p[1] == "no report" or p[1][1] == "nothing (timed out)")
        for p in procs:
            p.join(5)
        owner.close()
        owner.unlink()
        where = f"{n} reader process(es), {count} messages" + (", reader 1 slow" if n == 4 else "")
        for r, rep in problems:
            if rep[0] == "raised":
                where_yours = f" in {rep[2]}" if rep[2] else ""
                raise Fail(f"reader process {r} raised {rep[1]}{where_yours}, while it attached by "
                           "name (ShmRing(..., name=...)), made its reader (reader(r)) or read "
                           "(try_read)", input=where)
            k, got, want = rep if rep != "no report" else ("?", "no report", "a report")
            late = (" (the writer filled the ring before the readers attached: attaching by name "
                    "must not reset the segment)") if isinstance(k, int) and k < c else ""
            raise Fail(f"reader {r} got a wrong message {k}{late}", expected=want, got=got,
                       input=where)
        if lost is not None:
            raise Fail(f"timed out: the writer waited {PROCESS_WAIT_S:g} s for chunk "
                       f"{lost % c} to be read by every reader (message {lost}). A reader never "
                       "set its read flag, or the writer reads the wrong flags.", input=where)
