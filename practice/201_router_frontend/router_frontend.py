"""Exercise 201: a ROUTER front end that dispatches to DP engines by identity (see README.md)."""

from __future__ import annotations

import os
import time

import zmq

IDENTITY_BYTES = 2  # the DP rank as a little-endian u16, as vLLM's core_client does
READY, ADD, STOP = b"READY", b"ADD", b"STOP"
OUTPUT_LINGER_MS = 1000  # an engine's last outputs get this long to leave; then term() returns


def engine_identity(rank: int) -> bytes:
    """The DEALER identity of engine `rank`: 2 bytes, little endian."""
    raise NotImplementedError("TODO: check 0 <= rank < 65536, then rank.to_bytes(...)")


def rank_of(identity: bytes) -> int:
    """The DP rank an identity frame names (the inverse of engine_identity)."""
    raise NotImplementedError("TODO: check the length, then int.from_bytes(...)")


def run_engine(rank: int, input_address: str, output_address: str,
               idle_timeout: float = 30.0) -> None:
    """An engine: say READY, answer each ADD with the reversed prompt, return on STOP or idleness."""
    raise NotImplementedError("TODO: a DEALER with its identity and a PUSH; READY first; "
                              "close both and terminate the context on the way out")


class FrontEnd:
    """Binds a ROUTER for requests and a PULL for outputs; routes by DP rank."""

    def __init__(self, input_address: str, output_address: str, n_engines: int):
        self.n_engines = n_engines
        raise NotImplementedError("TODO: a context, a ROUTER bound to input_address, "
                                  "a PULL bound to output_address")

    def wait_ready(self, timeout: float) -> list[int]:
        """Wait until every engine has sent READY; return the ranks, sorted."""
        raise NotImplementedError("TODO: poll the ROUTER until all n_engines said READY")

    def add_request(self, request_id: str, prompt: bytes, engine: int | None = None) -> int:
        """Send the request to `engine`, or to the next engine in round-robin order."""
        raise NotImplementedError("TODO: [identity, ADD, request_id, prompt] on the ROUTER")

    def get_outputs(self, n: int, timeout: float) -> list[tuple[str, int, bytes]]:
        """Gather n outputs (request_id, rank, output) in arrival order."""
        raise NotImplementedError("TODO: poll the PULL with what is left of the timeout")

    def shutdown(self) -> None:
        """Tell every engine that said READY to stop."""
        raise NotImplementedError("TODO: [identity, STOP] to each ready engine")

    def close(self) -> None:
        """Close both sockets, terminate the context, remove the ipc socket files we bound."""
        raise NotImplementedError("TODO: close the sockets, ctx.term(), os.unlink the ipc "
                                  "files; a second close() does nothing")
