"""Exercise 401, reference answer: a front end that routes requests to the least-loaded of N
data-parallel engines over one ROUTER socket, and sends each abort where its request went.

Each engine's DEALER has its DP rank as identity, 2 bytes little endian
(vllm/v1/engine/core.py:1191). The client keeps reqs_in_flight (request id -> engine) and a
per-engine in-flight count; a request leaves both when its engine reports it finished
(vllm/v1/engine/core_client.py:1727, :1751 routing, :1824 finished, :1874 aborts).
"""

from __future__ import annotations

import os
import time
from collections import defaultdict

import msgspec
import zmq

READY, ADD, ABORT, OUTPUTS, STOP = b"READY", b"ADD", b"ABORT", b"OUTPUTS", b"STOP"  # pragma: no mutate


class AddRequest(msgspec.Struct):  # pragma: no mutate block
    request_id: str
    max_tokens: int


class EngineOutputs(msgspec.Struct):  # pragma: no mutate block
    engine_index: int
    new_tokens: dict[str, list[int]]  # request id -> tokens generated since the last outputs
    finished_requests: list[str]  # finished, or aborted, on this engine


def engine_identity(rank: int) -> bytes:
    if not 0 <= rank < 1 << 16:
        raise ValueError(f"a DP rank must be in [0, 65535], got {rank}")
    return rank.to_bytes(2, "little")


def rank_of(identity: bytes) -> int:
    if len(identity) != 2:
        raise ValueError(f"a DP identity is 2 bytes, got {identity!r}")
    return int.from_bytes(identity, "little")


class DPLBClient:
    """Routes requests to the least-loaded engine; aborts follow their request."""

    def __init__(self, address: str, n_engines: int):
        self.n_engines = n_engines
        self.address = address
        self.ctx = zmq.Context()
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a send to an unknown peer raises
        self.router.bind(address)
        self.reqs_in_flight: dict[str, int] = {}
        self.engine_inflight = [0] * n_engines
        self.start_index = 0  # where the next scan starts: ties rotate
        self.ready: set[int] = set()  # the ranks whose READY came, in any call
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(EngineOutputs)

    def wait_ready(self, timeout: float) -> list[int]:
        deadline = time.monotonic() + timeout
        while len(self.ready) < self.n_engines:
            left = deadline - time.monotonic()
            if left <= 0 or not self.router.poll(int(left * 1000)):
                missing = sorted(set(range(self.n_engines)) - self.ready)
                raise TimeoutError(f"engines {missing} did not send READY within {timeout:g} s")
            identity, *frames = self.router.recv_multipart()
            if frames == [READY]:
                self.ready.add(rank_of(identity))
        return sorted(self.ready)

    def choose_engine(self) -> int:
        """The engine with the fewest requests in flight, scanning from a rotating start."""
        best, best_load = self.start_index, None
        for i in range(self.n_engines):
            idx = (self.start_index + i) % self.n_engines
            if best_load is None or self.engine_inflight[idx] < best_load:
                best, best_load = idx, self.engine_inflight[idx]
        self.start_index = (self.start_index + 1) % self.n_engines
        return best

    def add_request(self, request_id: str, max_tokens: int, engine: int | None = None) -> int:
        if request_id in self.reqs_in_flight:
            raise ValueError(f"request {request_id!r} is already in flight on engine "
                             f"{self.reqs_in_flight[request_id]}")
        if engine is None:
            engine = self.choose_engine()
        elif not 0 <= engine < self.n_engines:
            raise ValueError(f"engine must be in [0, {self.n_engines - 1}], got {engine}")
        self.router.send_multipart([engine_identity(engine), ADD,
                                    self._encoder.encode(AddRequest(request_id, max_tokens))])
        self.reqs_in_flight[request_id] = engine
        self.engine_inflight[engine] += 1
        return engine

    def abort(self, request_ids: list[str]) -> dict[int, list[str]]:
        """Send each id to the engine that has it; ids not in flight are ignored."""
        by_engine: dict[int, list[str]] = defaultdict(list)
        for request_id in request_ids:
            if (engine := self.reqs_in_flight.get(request_id)) is not None:
                by_engine[engine].append(request_id)
        for engine, ids in by_engine.items():
            self.router.send_multipart([engine_identity(engine), ABORT,
                                        self._encoder.encode(ids)])
        return dict(by_engine)

    def poll_outputs(self, timeout: float) -> list[EngineOutputs]:
        """Wait up to timeout for outputs; take all that are there; forget finished requests."""
        got = []
        wait_ms = int(timeout * 1000)
        while self.router.poll(wait_ms):
            identity, kind, *payload = self.router.recv_multipart()
            if kind == READY:  # an engine that started after wait_ready gave up on it
                self.ready.add(rank_of(identity))
                continue
            out = self._decoder.decode(payload[0])
            for request_id in out.finished_requests:
                if (engine := self.reqs_in_flight.pop(request_id, None)) is not None:
                    self.engine_inflight[engine] -= 1
            got.append(out)
            wait_ms = 0  # drain what is there, do not wait again
        return got

    def load(self) -> list[int]:
        return list(self.engine_inflight)

    def shutdown(self) -> None:
        for rank in range(self.n_engines):
            try:
                self.router.send_multipart([engine_identity(rank), STOP])
            except zmq.ZMQError:  # that engine is gone already (ROUTER_MANDATORY)
                pass

    def close(self) -> None:
        if self.ctx.closed:
            return
        self.router.close()
        self.ctx.term()
        if self.address.startswith("ipc://"):
            try:
                os.unlink(self.address.removeprefix("ipc://"))
            except FileNotFoundError:
                pass
