"""Exercise 201, reference answer: a ROUTER front end that dispatches to DP engines by identity.

Requests go ROUTER (front end, binds) -> DEALER (engine, connects, identity = DP rank as 2
little-endian bytes); outputs come back PUSH (engine) -> PULL (front end, binds).
"""

from __future__ import annotations

import os
import time

import zmq

IDENTITY_BYTES = 2  # the DP rank as a little-endian u16, as vLLM's core_client does
READY, ADD, STOP = b"READY", b"ADD", b"STOP"
OUTPUT_LINGER_MS = 1000  # an engine's last outputs get this long to leave; then term() returns  # pragma: no mutate


def engine_identity(rank: int) -> bytes:
    """The DEALER identity of engine `rank`: 2 bytes, little endian."""
    if not 0 <= rank < 1 << (8 * IDENTITY_BYTES):
        raise ValueError(f"a DP rank must be in [0, 65535], got {rank}")
    return rank.to_bytes(IDENTITY_BYTES, "little")


def rank_of(identity: bytes) -> int:
    """The DP rank an identity frame names (the inverse of engine_identity)."""
    if len(identity) != IDENTITY_BYTES:
        raise ValueError(f"a DP identity is {IDENTITY_BYTES} bytes, got {identity!r}")
    return int.from_bytes(identity, "little")


def run_engine(rank: int, input_address: str, output_address: str,
               idle_timeout: float = 30.0) -> None:
    """An engine: say READY, answer each ADD with the reversed prompt, return on STOP or idleness."""
    ctx = zmq.Context()
    identity = engine_identity(rank)
    inp = ctx.socket(zmq.DEALER)
    inp.setsockopt(zmq.IDENTITY, identity)  # before connect: the ROUTER reads it on connect
    inp.setsockopt(zmq.LINGER, 0)
    out = ctx.socket(zmq.PUSH)
    out.setsockopt(zmq.LINGER, OUTPUT_LINGER_MS)
    try:
        inp.connect(input_address)
        out.connect(output_address)
        inp.send(READY)  # the ROUTER cannot route to us before we have spoken
        while inp.poll(int(idle_timeout * 1000)):
            frames = inp.recv_multipart()
            if frames[0] == STOP:
                return
            if frames[0] == ADD:
                _, request_id, prompt = frames
                out.send_multipart([identity, request_id, prompt[::-1]])
    finally:
        inp.close()
        out.close()
        ctx.term()


class FrontEnd:
    """Binds a ROUTER for requests and a PULL for outputs; routes by DP rank."""

    def __init__(self, input_address: str, output_address: str, n_engines: int):
        self.n_engines = n_engines
        self.ctx = zmq.Context()
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.pull = self.ctx.socket(zmq.PULL)
        self.pull.setsockopt(zmq.LINGER, 0)
        self.router.bind(input_address)
        self.pull.bind(output_address)
        self.bound = [input_address, output_address]
        self.ready: list[int] = []
        self._next = 0  # round-robin position

    def wait_ready(self, timeout: float) -> list[int]:
        """Wait until every engine has sent READY; return the ranks, sorted."""
        deadline = time.monotonic() + timeout
        seen: set[int] = set(self.ready)
        while len(seen) < self.n_engines:
            left = deadline - time.monotonic()
            if left <= 0 or not self.router.poll(int(left * 1000)):
                missing = sorted(set(range(self.n_engines)) - seen)
                raise TimeoutError(f"engines {missing} did not send READY within {timeout:g} s")
            identity, *frames = self.router.recv_multipart()
            if frames == [READY]:
                seen.add(rank_of(identity))
                self.ready = sorted(seen)  # a later call counts it, even if this one times out
        return self.ready

    def add_request(self, request_id: str, prompt: bytes, engine: int | None = None) -> int:
        """Send the request to `engine`, or to the next engine in round-robin order."""
        if engine is None:
            engine = self.ready[self._next % len(self.ready)]
            self._next += 1
        self.router.send_multipart([engine_identity(engine), ADD, request_id.encode(), prompt])
        return engine

    def get_outputs(self, n: int, timeout: float) -> list[tuple[str, int, bytes]]:
        """Gather n outputs (request_id, rank, output) in arrival order."""
        deadline = time.monotonic() + timeout
        outputs = []
        while len(outputs) < n:
            left = deadline - time.monotonic()
            if left <= 0 or not self.pull.poll(int(left * 1000)):
                raise TimeoutError(f"got {len(outputs)} of {n} outputs within {timeout:g} s")
            identity, request_id, output = self.pull.recv_multipart()
            outputs.append((request_id.decode(), rank_of(identity), output))
        return outputs

    def shutdown(self) -> None:
        """Tell every engine that said READY to stop."""
        for rank in self.ready:
            self.router.send_multipart([engine_identity(rank), STOP])

    def close(self) -> None:
        """Close both sockets, terminate the context, remove the ipc socket files we bound."""
        if self.ctx.closed:
            return
        self.router.close()
        self.pull.close()
        self.ctx.term()
        for address in self.bound:  # libzmq 4.3 leaves a bound ipc:// file behind
            if address.startswith("ipc://"):
                try:
                    os.unlink(address.removeprefix("ipc://"))
                except FileNotFoundError:
                    pass
