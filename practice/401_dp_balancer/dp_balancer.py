"""Exercise 401 (see README.md): a front end that routes requests to the least-loaded of N
data-parallel engines over one ROUTER socket, and sends each abort where its request went.

Each engine's DEALER has its DP rank as identity, 2 bytes little endian
(vllm/v1/engine/core.py:1191). The client keeps reqs_in_flight (request id -> engine) and a
per-engine in-flight count; a request leaves both when its engine reports it finished
(vllm/v1/engine/core_client.py:1727, :1751 routing, :1824 finished, :1874 aborts).
"""

from __future__ import annotations

import os
import time
import msgspec
import zmq

READY, ADD, ABORT, OUTPUTS, STOP = b"READY", b"ADD", b"ABORT", b"OUTPUTS", b"STOP"


class AddRequest(msgspec.Struct):
    request_id: str
    max_tokens: int


class EngineOutputs(msgspec.Struct):
    engine_index: int
    new_tokens: dict[str, list[int]]  # request id -> tokens generated since the last outputs
    finished_requests: list[str]  # finished, or aborted, on this engine


def engine_identity(rank: int) -> bytes:
    """The DEALER identity of engine `rank`: 2 bytes, little endian."""
    raise NotImplementedError("TODO: check the range, then rank.to_bytes(...)")


def rank_of(identity: bytes) -> int:
    raise NotImplementedError("TODO: the inverse of engine_identity")


class DPLBClient:
    """Routes requests to the least-loaded engine; aborts follow their request."""

    def __init__(self, address: str, n_engines: int):
        self.n_engines = n_engines
        self.reqs_in_flight: dict[str, int] = {}  # request id -> the engine it went to
        raise NotImplementedError("TODO: a context and a ROUTER bound to address; per-engine "
                                  "in-flight counts; the rotating start index")

    def wait_ready(self, timeout: float) -> list[int]:
        raise NotImplementedError("TODO: poll until every engine sent [identity, b'READY']")

    def choose_engine(self) -> int:
        """The engine with the fewest requests in flight, scanning from a rotating start."""
        raise NotImplementedError("TODO")

    def add_request(self, request_id: str, max_tokens: int, engine: int | None = None) -> int:
        raise NotImplementedError("TODO: choose, send [identity, ADD, msgpack AddRequest], "
                                  "record it in flight")

    def abort(self, request_ids: list[str]) -> dict[int, list[str]]:
        """Send each id to the engine that has it; ids not in flight are ignored."""
        raise NotImplementedError("TODO: group the ids by engine with reqs_in_flight")

    def poll_outputs(self, timeout: float) -> list[EngineOutputs]:
        """Wait up to timeout for outputs; take all that are there; forget finished requests."""
        raise NotImplementedError("TODO: decode EngineOutputs; finished ids leave the map")

    def load(self) -> list[int]:
        raise NotImplementedError("TODO: the in-flight count of each engine")

    def shutdown(self) -> None:
        raise NotImplementedError("TODO: [identity, STOP] to every engine")

    def close(self) -> None:
        raise NotImplementedError("TODO: close the socket, term the context, unlink the ipc "
                                  "file; a second close() does nothing")
