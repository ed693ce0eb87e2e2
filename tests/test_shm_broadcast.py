"""ShmRingBuffer and MessageQueue with real processes, real shared memory and real sockets."""

import multiprocessing as mp
import multiprocessing.resource_tracker
import os
import pickle
import random
import signal
import threading
import time

import numpy as np
import pytest

from msgspec import msgpack

from minivllm.distributed.shm_broadcast import MessageQueue, QueueShutdown
from minivllm.distributed.shm_ring import ShmRingBuffer, check_shm_free_space
from minivllm.serial import DecodeError

# The interpreter's resource tracker (which unlinks a crashed creator's segments) is one
# process per interpreter, started at the first segment: start it before any test's snapshot.
multiprocessing.resource_tracker.ensure_running()
CTX = mp.get_context("fork")  # fast to start; every reader attaches from the handle anyway
CHUNK = 1024  # small chunks, so that a few messages in every hundred overflow
STEP_TIMEOUT_S = 30.0  # a message missing this long is a bug, not slowness


def message(seed: int, i: int):
    """Message i: an int, small bytes, an array sent out of band, or one too big for a chunk."""
    kind = (i * 2654435761 + seed) % 100
    if kind < 60:
        return i
    if kind < 90:
        return [i, random.Random(i).randbytes(kind % 50)]
    if kind < 97:
        return {"i": i, "ids": np.arange(i % 200 + 64, dtype=np.int32)}  # 256+ B: out of band
    return {"i": i, "big": np.full(CHUNK, i % 251, dtype=np.uint8)}  # overflows the chunk


def same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def read_all(handle, rank, seed, count, conn):
    """A reader process: check every message against the expected sequence, report once."""
    mq = MessageQueue.create_from_handle(handle, rank)
    problem = None
    try:
        mq.wait_until_ready(STEP_TIMEOUT_S)
        for i in range(count):
            got = mq.dequeue(timeout=STEP_TIMEOUT_S)
            if not same(message(seed, i), got):
                problem = f"message {i}: expected {message(seed, i)!r:.80}, got {got!r:.80}"
                break
    except Exception as e:
        problem = f"{type(e).__name__}: {e}"
    conn.send(problem)
    mq.close()


def broadcast(n_reader, n_local, count, seed, max_chunks=8, busy_loop_s=0.1, gap_s=0.0):
    """count messages to n_reader reader processes; gap_s: a random pause of up to this long
    before each message."""
    mq = MessageQueue(n_reader, n_local, max_chunk_bytes=CHUNK, max_chunks=max_chunks,
                      busy_loop_s=busy_loop_s)
    pauses = random.Random(seed)
    pipes = [CTX.Pipe(duplex=False) for _ in range(n_reader)]
    procs = [CTX.Process(target=read_all, args=(mq.export_handle(), r, seed, count, pipes[r][1]))
             for r in range(n_reader)]
    try:
        for p in procs:
            p.start()
        mq.wait_until_ready(STEP_TIMEOUT_S)
        for i in range(count):
            if gap_s:
                time.sleep(pauses.random() * gap_s)
            mq.enqueue(message(seed, i), timeout=STEP_TIMEOUT_S)
        return [rx.recv() if rx.poll(STEP_TIMEOUT_S) else "no report" for rx, _ in pipes]
    finally:
        for p in procs:
            p.join(STEP_TIMEOUT_S)
            if p.is_alive():
                p.kill()
                p.join()
        mq.close()


@pytest.mark.parametrize("n_reader", [1, 2, 3, 4])
def test_every_reader_gets_every_message_once_in_order(n_reader):
    reports = broadcast(n_reader, n_reader, 100_000, seed=n_reader)
    assert reports == [None] * n_reader, reports


def test_readers_that_block_between_messages_miss_no_wakeup(monkeypatch):
    """Pauses on both sides of busy_loop_s: about half the messages race a reader setting the
    waiting flag on its way to block. With the periodic re-check out of reach, one lost wakeup
    leaves a reader blocked past its STEP_TIMEOUT_S, and its report says so."""
    from minivllm.distributed import spin_condition

    monkeypatch.setattr(spin_condition, "RECHECK_S", 4 * STEP_TIMEOUT_S)  # forked readers too
    reports = broadcast(3, 3, 600, seed=9, busy_loop_s=0.001, gap_s=0.002)
    assert reports == [None] * 3, reports


def test_overflow_happens_in_the_mixed_stream():
    kinds = [message(0, i) for i in range(1000)]
    big = [m for m in kinds if isinstance(m, dict) and "big" in m]
    assert 10 < len(big) < 100  # the stream above really exercises the XPUB path


def test_remote_reader_over_tcp_with_a_local_reader():
    reports = broadcast(n_reader=2, n_local=1, count=3000, seed=7)
    assert reports == [None, None], reports


def test_only_remote_readers():
    reports = broadcast(n_reader=2, n_local=0, count=2000, seed=8)
    assert reports == [None, None], reports


def slow_reader(handle, rank, ready):
    mq = MessageQueue.create_from_handle(handle, rank)
    mq.wait_until_ready(STEP_TIMEOUT_S)
    ready.set()
    while True:
        mq.dequeue()


def test_a_killed_reader_makes_the_writer_time_out_naming_it():
    mq = MessageQueue(2, 2, max_chunk_bytes=256, max_chunks=4)
    ready = [CTX.Event() for _ in range(2)]
    procs = [CTX.Process(target=slow_reader, args=(mq.export_handle(), r, ready[r]))
             for r in range(2)]
    try:
        for p in procs:
            p.start()
        mq.wait_until_ready(STEP_TIMEOUT_S)
        for i in range(100):
            mq.enqueue(i, timeout=STEP_TIMEOUT_S)
        os.kill(procs[1].pid, signal.SIGKILL)
        procs[1].join()
        with pytest.raises(TimeoutError, match=r"reader\(s\) \[1\] of 2.*alive"):
            for i in range(100):
                mq.enqueue(i, timeout=1.0)
    finally:
        for p in procs:
            p.kill()
            p.join()
        mq.close()


def attach_reader(mq: MessageQueue, handle=None) -> MessageQueue:
    """Reader 0 of mq in this process, after both sides' ready handshake (the reader's half
    runs on a thread, since each side waits for the other)."""
    reader = MessageQueue.create_from_handle(handle or mq.export_handle(), 0)
    t = threading.Thread(target=reader.wait_until_ready, args=(10,))
    t.start()
    mq.wait_until_ready(10)
    t.join()
    return reader


def test_reader_timeout_names_the_chunk_and_the_writer():
    with MessageQueue(1, 1, max_chunk_bytes=256, max_chunks=2, busy_loop_s=0.01) as mq:
        reader = attach_reader(mq, pickle.loads(pickle.dumps(mq.export_handle())))
        mq.enqueue("one")
        assert reader.dequeue(timeout=1) == "one"
        with pytest.raises(TimeoutError, match=r"reader 0 waited 0.2 s for chunk 1 .*writer alive"):
            reader.dequeue(timeout=0.2)
        reader.close()


def test_shutdown_wakes_a_blocked_reader():
    with MessageQueue(1, 1, max_chunk_bytes=256, max_chunks=2, busy_loop_s=0.0) as mq:
        reader = attach_reader(mq)
        outcome = []

        def block():
            try:
                reader.dequeue()  # no timeout: only shutdown() can end this
            except QueueShutdown as e:
                outcome.append(e)
        t = threading.Thread(target=block)
        t.start()
        reader.shutdown()
        t.join(STEP_TIMEOUT_S)
        assert not t.is_alive() and len(outcome) == 1
        reader.close()


def test_wait_until_ready_times_out_counting_subscriptions():
    with MessageQueue(2, 2, max_chunk_bytes=256, max_chunks=2) as mq:
        with pytest.raises(TimeoutError, match=r"2 reader subscriptions on ipc://.*\(got 0\)"):
            mq.wait_until_ready(timeout=0.2)


def test_ring_flags_follow_the_state_table():
    ring = ShmRingBuffer(n_reader=2, max_chunk_bytes=16, max_chunks=2)
    try:
        w = ring.written_offset(1)
        assert (ring.metadata_offset, w) == (32, 32 + 3)
        assert ring.writable(0) and not ring.readable(0, 0)  # empty
        data = ring.begin_write(0)
        data[:3] = b"abc"
        data.release()
        ring.end_write(0)
        assert bytes(ring.buf[32:35]) == b"\x01\x00\x00"  # fresh: w=1, nobody read
        assert not ring.writable(0) and ring.readable(0, 0) and ring.readable(0, 1)
        ring.end_read(0, 0)
        assert not ring.writable(0) and not ring.readable(0, 0) and ring.unread_by(0) == [1]
        ring.end_read(0, 1)
        assert ring.writable(0)  # consumed by all
        other = pickle.loads(pickle.dumps(ring))  # the handle attaches to the same memory
        assert bytes(other.chunk(0)[:3]) == b"abc" and not other.is_creator
        other.close()
    finally:
        ring.close()


def test_attaching_with_a_wrong_handle_says_so():
    ring = ShmRingBuffer(1, 64, 2)
    try:
        with pytest.raises(ValueError, match="does not match"):
            ShmRingBuffer(1, 1 << 20, 2, name=ring.name)
    finally:
        ring.close()


def test_shm_free_space_error_says_what_to_do():
    with pytest.raises(RuntimeError, match=r"MiB free, the ring needs .*--shm-size"):
        check_shm_free_space(1 << 60)


def test_executor_shape_broadcast_then_one_reply_queue_per_worker():
    from minivllm.demos.ring_executor import DemoExecutor, step_round_trips

    with DemoExecutor(world_size=2) as executor:
        replies = executor.execute(0, np.arange(10, dtype=np.int32))
        assert replies == [{"rank": 0, "step": 0, "partial_sum": 20},
                           {"rank": 1, "step": 0, "partial_sum": 25}]
        assert len(step_round_trips(executor, steps=50, n_tokens=100_000)) == 50  # overflows too


def test_an_idle_reader_blocked_in_poll_is_woken_by_the_notification(monkeypatch):
    """With the periodic re-check pushed out of reach, only the notify socket can wake a reader
    that went idle: a lost wakeup would make this dequeue time out."""
    from minivllm.distributed import spin_condition

    monkeypatch.setattr(spin_condition, "RECHECK_S", 60.0)
    with MessageQueue(1, 1, max_chunk_bytes=256, max_chunks=4, busy_loop_s=0.02) as mq:
        reader = attach_reader(mq)
        got = []

        def read(n):
            for _ in range(n):
                got.append(reader.dequeue())  # no deadline: nothing but a notification wakes it
        for burst in range(3):
            t = threading.Thread(target=read, args=(3,))
            t.start()
            threading.Event().wait(0.2)  # the reader is past busy_loop_s: blocked in poll
            for i in range(3):
                mq.enqueue(burst * 3 + i)
            t.join(STEP_TIMEOUT_S)
            lost = t.is_alive()
            if lost:
                reader.shutdown()
                t.join()
            assert not lost, f"burst {burst}: the blocked reader was never woken (got {got})"
        assert got == list(range(9))
        reader.close()


def test_dequeued_arrays_do_not_alias_the_ring():
    """Small arrays travel inline in the msgpack body, and msgspec hands them to the decoder as
    views of its input: the reader must decode from a copy, or the writer's next lap rewrites
    arrays the reader already returned."""
    writer = MessageQueue(1, 1, max_chunk_bytes=1024, max_chunks=2)
    reader = attach_reader(writer)
    try:
        writer.enqueue({"ids": np.arange(8, dtype=np.int32), "tag": "first"})
        first = reader.dequeue(timeout=5)
        for lap in range(4):  # the writer reuses both chunks twice
            writer.enqueue({"ids": np.full(8, -1 - lap, dtype=np.int32), "tag": "later"})
            assert reader.dequeue(timeout=5)["tag"] == "later"
        assert first["ids"].tolist() == list(range(8)) and first["tag"] == "first"
    finally:
        reader.close()
        writer.close()


def test_a_message_that_does_not_decode_is_consumed_and_the_next_one_follows():
    """The reader decodes in the chunk it holds: a DecodeError there must still release the
    chunk and move on, or the reader would fail on the same chunk forever."""
    writer = MessageQueue(1, 1, max_chunk_bytes=1024, max_chunks=2)
    reader = attach_reader(writer)
    try:
        for lap in range(3):  # both chunks, more than once: the flags were released each time
            writer.enqueue(msgpack.Ext(99, b"?"))  # an ext code no decoder knows
            writer.enqueue(f"after {lap}")
            with pytest.raises(DecodeError, match="unknown msgpack ext code 99"):
                reader.dequeue(timeout=5)
            assert reader.dequeue(timeout=5) == f"after {lap}"
    finally:
        reader.close()
        writer.close()


@pytest.mark.parametrize("n_local", [1, 0])
def test_a_body_handed_to_zmq_is_not_rewritten_by_the_next_message(n_local):
    """The writer encodes every body into one reused buffer. A body bigger than a chunk goes
    to a socket without a copy (over 64 KiB pyzmq keeps a reference and sends it later), and so
    does every message to a remote reader: the next message must not encode over it."""
    writer = MessageQueue(1, n_local, max_chunk_bytes=1024, max_chunks=8)
    reader = attach_reader(writer)
    try:
        big = [bytes([i]) * 200_000 for i in range(3)]  # bin values inline in the body
        for i, body in enumerate(big):
            writer.enqueue(body)
            writer.enqueue(f"small {i}")
        for i, body in enumerate(big):
            assert reader.dequeue(timeout=5) == body
            assert reader.dequeue(timeout=5) == f"small {i}"
    finally:
        reader.close()
        writer.close()


def write_mixed(handle_conn, count):
    """A writer process: every 3rd message overflows (1 MiB), the rest are small ints."""
    mq = MessageQueue(1, 1, max_chunk_bytes=CHUNK, max_chunks=4)
    handle_conn.send(mq.export_handle())
    try:
        mq.wait_until_ready(STEP_TIMEOUT_S)
        for i in range(count):
            mq.enqueue(np.full(1 << 20, i % 251, np.uint8) if i % 3 == 0 else i,
                       timeout=STEP_TIMEOUT_S)
        handle_conn.recv()  # the reader got everything: only now may the sockets close
    finally:
        mq.close()


def test_a_timeout_while_overflow_frames_are_on_the_way_loses_and_reorders_nothing():
    """dequeue(timeout=0) often finds an overflow chunk whose 1 MiB frames have not arrived
    yet. That timeout must leave the queue where it was: the retry returns the same message."""
    count = 60
    parent, child = CTX.Pipe()
    proc = CTX.Process(target=write_mixed, args=(child, count))
    proc.start()
    reader = None
    try:
        reader = MessageQueue.create_from_handle(parent.recv(), 0)
        reader.wait_until_ready(STEP_TIMEOUT_S)
        got, overflow_timeouts = [], 0
        deadline = time.monotonic() + 20  # a lost message would retry forever
        while len(got) < count and time.monotonic() < deadline:
            try:
                m = reader.dequeue(timeout=0)
            except TimeoutError as e:
                overflow_timeouts += "overflow" in str(e)
                continue
            got.append(int(m[0]) if isinstance(m, np.ndarray) else m)
        parent.send("done")
        assert got == [i % 251 if i % 3 == 0 else i for i in range(count)]
        assert overflow_timeouts > 0, "no timeout hit a pending overflow: the test proved nothing"
    finally:
        proc.join(STEP_TIMEOUT_S)
        if proc.is_alive():
            proc.kill()
            proc.join()
        if reader is not None:
            reader.close()
