"""The processes of `minivllm bench ring`: a broadcast phase on any of three transports.

Reader processes live for the whole benchmark. For every phase the writer makes a fresh
channel (a MessageQueue; a bare ShmRingBuffer, the limit; or a ZMQ XPUB socket over ipc),
sends its address over the control pipe, and each reader attaches, receives `n` messages
and reports back:
    (perf_counter_ns at the last message, one-way latencies in ns, CPU seconds used).
A message is [send time in perf_counter_ns, payload bytes]; perf_counter is CLOCK_MONOTONIC,
which every process on the machine shares, so receive time minus send time is a latency.
The bare ring ("raw") carries the same two things with no serialization, as
    | u32 payload length | u64 send time | payload |
and its readers only spin (sched_yield), never block: what any ring could do.
"""

from __future__ import annotations

import os
import struct
import time
from dataclasses import dataclass

import numpy as np
import zmq

from minivllm.distributed.shm_broadcast import MessageQueue
from minivllm.distributed.shm_ring import NOT_READY, ShmRingBuffer
from minivllm.serial import MsgpackDecoder, MsgpackEncoder
from minivllm.utils.zmq import ipc_address

READY_TIMEOUT_S = 60.0  # readers attach within this, or the benchmark stops with an error
RECV_TIMEOUT_S = 60.0
RAW_HEADER = struct.Struct("<IQ")  # the bare ring's chunk: payload length, send time


@dataclass
class Phase:
    transport: str  # "mq", "raw" or "pubsub"
    size: int  # payload bytes
    n: int  # messages
    pace_s: float = 0.0  # 0: as fast as possible; > 0: one message per pace_s (latency)
    busy_loop_s: float = 0.1  # MessageQueue readers: spin this long after a read, then block


def pubsub_writer(n_reader: int) -> tuple[zmq.Context, zmq.Socket, str]:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.XPUB)
    sock.setsockopt(zmq.XPUB_VERBOSE, 1)
    sock.setsockopt(zmq.SNDHWM, 0)  # PUB drops at the high-water mark; the benchmark must not
    address = ipc_address("bench")
    sock.bind(address)
    return ctx, sock, address.removeprefix("ipc://")


def wait_subscriptions(sock: zmq.Socket, n: int) -> None:
    for _ in range(n):
        if not sock.poll(int(READY_TIMEOUT_S * 1000)):
            raise TimeoutError(f"only some of {n} readers subscribed within {READY_TIMEOUT_S} s")
        sock.recv()


def _raw_fill(buf, start: int, size: int, msg) -> bool:
    sent, payload = msg
    RAW_HEADER.pack_into(buf, start, len(payload), sent)
    begin = start + RAW_HEADER.size
    buf[begin:begin + len(payload)] = payload
    return True


def _raw_copy_out(buf, start: int):
    n, sent = RAW_HEADER.unpack_from(buf, start)
    begin = start + RAW_HEADER.size
    return sent, bytes(buf[begin:begin + n])  # a copy, as MessageQueue makes


def _spin(step, what: str, timeout: float = RECV_TIMEOUT_S):
    """step() until it returns something; sched_yield between tries."""
    deadline = time.monotonic() + timeout
    while (got := step()) is NOT_READY:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} for {timeout:g} s")
        os.sched_yield()
    return got


class RawRing:
    """A bare ShmRingBuffer with its own index: the writer's and each reader's side."""

    def __init__(self, ring: ShmRingBuffer, rank: int = -1):
        self.ring, self.rank, self.idx = ring, rank, 0

    def send(self, msg, timeout: float) -> None:
        """Called as MessageQueue.enqueue(obj, timeout) is, so both pay the same call."""
        ring, idx = self.ring, self.idx
        if ring.write(idx, _raw_fill, msg) is NOT_READY:  # the spin loop only when it must wait
            _spin(lambda: ring.write(idx, _raw_fill, msg), "writer waited on a full ring", timeout)
        self.idx = (idx + 1) % ring.max_chunks

    def recv(self, timeout: float):
        ring, idx, rank = self.ring, self.idx, self.rank
        if (got := ring.read(idx, rank, _raw_copy_out)) is NOT_READY:
            got = _spin(lambda: ring.read(idx, rank, _raw_copy_out),
                        "reader waited on an empty ring", timeout)
        self.idx = (idx + 1) % ring.max_chunks
        return got


def reader_main(rank: int, conn) -> None:
    """Run phases until the writer sends None."""
    while (msg := conn.recv()) is not None:
        phase, address = msg
        conn.send(_run_phase(phase, address, rank, conn))
    conn.close()


def _run_phase(phase: Phase, address, rank: int, conn):
    decoder = MsgpackDecoder()
    if phase.transport == "mq":
        mq = MessageQueue.create_from_handle(address, rank, decoder=decoder)
        mq.wait_until_ready(READY_TIMEOUT_S)
        recv = mq.dequeue
        close = mq.close
    elif phase.transport == "raw":
        raw = RawRing(ShmRingBuffer(*address), rank)
        conn.send("attached")  # the writer starts when every reader has
        recv, close = raw.recv, raw.ring.close
    else:
        ctx = zmq.Context()
        sock = ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        sock.connect(address)

        # PUB/SUB at its best: pyzmq copies small frames faster than it wraps them in
        # zmq.Frame objects (about 10% more msgs/s at 1 KiB), and wraps big ones without a copy.
        copy = phase.size < zmq.COPY_THRESHOLD

        def recv(timeout: float):
            if not sock.poll(int(timeout * 1000)):
                raise TimeoutError(f"no message on {address} within {timeout:g} s")
            return decoder.decode(sock.recv_multipart(copy=copy))

        def close():
            sock.close(linger=0)
            ctx.term()
    latencies = np.empty(phase.n, dtype=np.int64)
    cpu0 = time.process_time()
    for i in range(phase.n):
        sent, _payload = recv(RECV_TIMEOUT_S)  # each transport's own call, no wrapper
        latencies[i] = time.perf_counter_ns() - sent
    done = time.perf_counter_ns()
    cpu = time.process_time() - cpu0
    close()
    return done, latencies, cpu


def write_phase(phase: Phase, send, n_reader: int) -> tuple[int, float]:
    """Send phase.n messages with `send(obj, timeout)`; return (start ns, writer CPU seconds
    so far).

    The caller reads the CPU clock again once the readers are done: a ZMQ writer's I/O thread
    is still sending after the last send() returns, and that work counts too."""
    payload = os.urandom(phase.size)
    cpu0, start = time.process_time(), time.perf_counter_ns()
    next_at = time.perf_counter()
    for _ in range(phase.n):
        if phase.pace_s:
            next_at += phase.pace_s
            while (left := next_at - time.perf_counter()) > 0:
                time.sleep(left)
        send([time.perf_counter_ns(), payload], RECV_TIMEOUT_S)
    return start, cpu0


def run_phase(phase: Phase, conns, max_chunk_bytes: int, max_chunks: int) -> dict:
    """The writer's side of one phase; returns the row of the results table."""
    n_reader = len(conns)
    if phase.transport == "mq":
        mq = MessageQueue(n_reader, n_reader, max_chunk_bytes, max_chunks,
                          busy_loop_s=phase.busy_loop_s)
        for conn in conns:
            conn.send((phase, mq.export_handle()))
        mq.wait_until_ready(READY_TIMEOUT_S)
        start, cpu0 = write_phase(phase, mq.enqueue, n_reader)
        reports = [conn.recv() for conn in conns]
        wcpu = time.process_time() - cpu0
        mq.close()
    elif phase.transport == "raw":
        raw = RawRing(ShmRingBuffer(n_reader, max_chunk_bytes, max_chunks))
        for conn in conns:
            conn.send((phase, raw.ring.handle()))
        for conn in conns:
            if not conn.poll(READY_TIMEOUT_S) or conn.recv() != "attached":
                raise TimeoutError(f"a reader did not attach to the bare ring in {READY_TIMEOUT_S} s")
        start, cpu0 = write_phase(phase, raw.send, n_reader)
        reports = [conn.recv() for conn in conns]
        wcpu = time.process_time() - cpu0
        raw.ring.close()
    else:
        ctx, sock, path = pubsub_writer(n_reader)
        encoder = MsgpackEncoder()
        for conn in conns:
            conn.send((phase, f"ipc://{path}"))
        wait_subscriptions(sock, n_reader)
        start, cpu0 = write_phase(phase, lambda o, _timeout: sock.send_multipart(encoder.encode(o)),
                                  n_reader)
        reports = [conn.recv() for conn in conns]
        wcpu = time.process_time() - cpu0
        sock.close(linger=0)
        ctx.term()
        os.unlink(path)
    end = max(r[0] for r in reports)
    lat_us = np.concatenate([r[1] for r in reports]) / 1e3
    seconds = (end - start) / 1e9
    return {"transport": phase.transport, "size": phase.size, "n": phase.n,
            "msgs_per_s": phase.n / seconds, "MB_per_s": phase.n * phase.size / seconds / 1e6,
            "p50_us": float(np.percentile(lat_us, 50)), "p99_us": float(np.percentile(lat_us, 99)),
            "cpu_s": wcpu + sum(r[2] for r in reports), "writer_cpu_s": wcpu,
            "wall_s": seconds}
