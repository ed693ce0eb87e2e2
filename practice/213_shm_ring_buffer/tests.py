"""The judge's tests for exercise 213. Each receives the learner's module as `ring`."""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import time

from minivllm.judge.api import Fail, check_equal, test
from minivllm.judge.interleave import InstrumentedBuffer, Violation, explore

PROCESS_WAIT_S = 8.0  # a message not delivered in this long means a lost flag, not slowness


# --- the layout from README.md, as the judge sees it -------------------------------------
def meta_base(n_chunks, chunk_bytes):
    return n_chunks * chunk_bytes


def label_for(n_readers, n_chunks, chunk_bytes):
    """Names bytes of the buffer for the timeline: 'chunk 1 read flag of reader 0'."""
    base = meta_base(n_chunks, chunk_bytes)

    def label(off):
        if off < base:
            return f"chunk {off // chunk_bytes} data"
        chunk, k = divmod(off - base, 1 + n_readers)
        return f"chunk {chunk} written flag" if k == 0 else f"chunk {chunk} read flag of reader {k - 1}"
    return label


@test(input="n_readers=2, n_chunks=4, chunk_bytes=64, and n_readers=3, n_chunks=2, chunk_bytes=32")
def layout(ring):
    for n, c, b in [(2, 4, 64), (3, 2, 32)]:
        where = f"n_readers={n}, n_chunks={c}, chunk_bytes={b}"
        check_equal(ring.buffer_size(n, c, b), c * b + c * (1 + n), "buffer_size", where)
        for i in range(c):
            check_equal(ring.chunk_offset(i, b), i * b, f"chunk_offset(chunk={i})", where)
            w = meta_base(c, b) + i * (1 + n)
            check_equal(ring.written_flag_offset(i, n, c, b), w, f"written_flag_offset(chunk={i})", where)
            for r in range(n):
                check_equal(ring.read_flag_offset(i, r, n, c, b), w + 1 + r,
                            f"read_flag_offset(chunk={i}, reader={r})", where)


@test(input="2 readers, 3 chunks of 16 bytes, one thread, a plain bytearray",
      hang="try_write or try_read must return at once (False / None) instead of waiting.")
def write_then_read(ring):
    n, c, b = 2, 3, 16
    buf = bytearray(c * b + c * (1 + n))
    writer = ring.RingWriter(buf, n, c, b)
    readers = [ring.RingReader(buf, r, n, c, b) for r in range(n)]
    label = label_for(n, c, b)
    msgs = [b"m0", b"", bytes(range(12))]  # the last one fills a chunk exactly
    check_equal([r.try_read() for r in readers], [None, None], "try_read on an empty ring")
    for i, m in enumerate(msgs):
        check_equal(writer.try_write(m), True, f"try_write(message {i}) into a free chunk")
        w = meta_base(c, b) + i * (1 + n)
        check_equal(buf[w], 1, f"the {label(w)} after writing it")
    check_equal(writer.try_write(b"x"), False, "try_write into a full ring (nobody has read)")
    for r, reader in enumerate(readers):
        for i, m in enumerate(msgs):
            check_equal(reader.try_read(), m, f"reader {r}'s message {i}")
        again = reader.try_read()
        if again is not None:
            raise Fail(f"reader {r} read a message a second time on its next lap: after copying a "
                       "chunk out, a reader must set its own read flag, so that it skips the chunk "
                       "until the writer refills it (and so that the writer may refill it)",
                       expected=None, got=again, input=f"try_read after reader {r} read all {c}")
    try:
        writer.try_write(bytes(b))
    except ValueError:
        pass
    else:
        raise Fail("a payload larger than chunk_bytes - 4 must raise ValueError",
                   input=f"try_write of {b} bytes with chunk_bytes={b}")


def _scenario(ring, n_readers, n_chunks, n_msgs, bound):
    chunk_bytes = 8
    msgs = [f"m{i}".encode() for i in range(n_msgs)]
    size = n_chunks * chunk_bytes + n_chunks * (1 + n_readers)
    got: list[list[bytes]] = []

    def make_bodies():
        shared = InstrumentedBuffer(size, label_for(n_readers, n_chunks, chunk_bytes))
        got.clear()
        got.extend([] for _ in range(n_readers))

        def writer_body(ctx):
            w = ring.RingWriter(shared.bind(ctx), n_readers, n_chunks, chunk_bytes)
            for m in msgs:
                while not w.try_write(m):
                    ctx.block()
                ctx.note(f"wrote {m!r}")

        def reader_body(r):
            def body(ctx):
                rd = ring.RingReader(shared.bind(ctx), r, n_readers, n_chunks, chunk_bytes)
                for k in range(n_msgs):
                    m = rd.try_read()
                    while m is None:
                        ctx.block()
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
    return explore(names, make_bodies, final_check, preemption_bound=bound, time_budget_s=8.0)


# (readers, chunks, messages, preemption bound): each small enough to search exhaustively
# in about a second or two, and big enough that the writer laps the ring.
SCENARIOS = [(1, 2, 3, 2), (2, 2, 3, 1)]


@test(input="writer + readers as threads, every buffer access a possible switch",
      timeout=40)
def interleavings(ring):
    for n_readers, n_chunks, n_msgs, bound in SCENARIOS:
        result = _scenario(ring, n_readers, n_chunks, n_msgs, bound)
        if result.failure:
            where = (f"{n_readers} reader(s), {n_chunks} chunks, {n_msgs} messages, "
                     f"up to {bound} preemption(s)")
            raise Fail(f"schedule {result.runs} of the search breaks the ring: "
                       f"{result.failure.failure}", input=where,
                       detail="The schedule that breaks it, step by step:\n" + result.timeline(last=32))


@test(input="a ring created, attached by name, closed twice and unlinked")
def cleanup(ring):
    owner = ring.ShmRing(2, 4, 64)
    name = owner.name.lstrip("/")
    other = ring.ShmRing(2, 4, 64, name=owner.name)
    if bytes(other.shm.buf[:ring.buffer_size(2, 4, 64)]) != bytes(ring.buffer_size(2, 4, 64)):
        raise Fail("a new ring must start zeroed (all flags 0)", input="ShmRing(2, 4, 64)")
    other.close()
    owner.close()
    with open("/proc/self/maps") as f:
        if name in f.read():
            raise Fail(f"after close() this process still maps /dev/shm/{name}: close() must "
                       "unmap the segment (SharedMemory.close())")
    owner.unlink()
    if os.path.exists(f"/dev/shm/{name}"):
        raise Fail(f"after unlink() /dev/shm/{name} still exists: the creator must unlink it")


def _messages(seed: int, count: int, max_len: int) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(rng.choice([0, 1, 7, max_len // 2, max_len])) for _ in range(count)]


def _reader_process(module_name, name, r, n, c, b, seed, count, conn):
    ring = __import__(module_name)
    expected = _messages(seed, count, b - 4)
    shm_ring = ring.ShmRing(n, c, b, name=name)
    rd, problem = shm_ring.reader(r), None
    for k in range(count):
        deadline, m = time.monotonic() + PROCESS_WAIT_S, rd.try_read()
        while m is None and time.monotonic() < deadline:
            os.sched_yield()
            m = rd.try_read()
        if m != expected[k]:
            problem = (k, "nothing (timed out)" if m is None else m, expected[k])
            break
    shm_ring.close()
    conn.send(problem)
    conn.close()


@test(input="1 to 4 reader processes, 3,000 messages of 0 to 60 bytes, 4 chunks of 64 bytes",
      timeout=60, hang="A reader or the writer waited forever: a flag that is never set or reset.")
def processes(ring):
    ctx = mp.get_context("fork")
    c, b, count = 4, 64, 3000
    for n in (1, 2, 4):
        owner = ring.ShmRing(n, c, b)
        pipes = [ctx.Pipe(duplex=False) for _ in range(n)]
        procs = [ctx.Process(target=_reader_process,
                             args=(ring.__name__, owner.name, r, n, c, b, n, count, pipes[r][1]))
                 for r in range(n)]
        for p in procs:
            p.start()
        writer, lost = owner.writer(), None
        for k, m in enumerate(_messages(n, count, b - 4)):
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
        where = f"{n} reader process(es), {count} messages"
        for r, rep in problems:
            k, got, want = rep if rep != "no report" else ("?", "no report", "a report")
            raise Fail(f"reader {r} got a wrong message {k}", expected=want, got=got, input=where)
        if lost is not None:
            raise Fail(f"timed out: the writer waited {PROCESS_WAIT_S:g} s for chunk "
                       f"{lost % c} to be read by every reader (message {lost}). A reader never "
                       "set its read flag, or the writer reads the wrong flags.", input=where)
