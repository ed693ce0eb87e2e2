"""Exercise 402 (see README.md): an engine core's IO threads and its abort path.

An input thread owns the DEALER: it decodes each message and puts it on input_queue; an ABORT
goes on aborts_queue as well. An output thread owns the PUSH and sends what the busy loop puts
on output_queue. The busy loop: take client requests, then step: schedule, execute (slow),
apply the aborts that arrived during execute, update. So no token of an aborted request is
emitted after its abort arrived, and aborting is idempotent
(vllm/v1/engine/core.py:1933 input thread, :2033 both queues, :667 step, :690 aborts queue;
vllm/v1/core/sched/scheduler.py:2994 finish_requests, :2327 skip finished in update).
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from typing import Callable

import msgspec
import zmq

READY, ADD, ABORT, SHUTDOWN = b"READY", b"ADD", b"ABORT", b"SHUTDOWN"
BLOCK_SIZE = 4  # tokens per KV block
POLL_MS = 20  # how often the IO threads look at their stop flag


class EngineCoreRequest(msgspec.Struct):
    request_id: str
    prompt_token_ids: list[int]
    max_tokens: int


class EngineCoreOutput(msgspec.Struct):
    request_id: str
    new_token_ids: list[int]
    finish_reason: str | None = None  # "length" on the last token


class EngineCoreOutputs(msgspec.Struct):
    outputs: list[EngineCoreOutput]
    finished_requests: list[str]  # finished since the last outputs, aborted ones included


# The model: {request id: tokens it has so far (prompt + outputs)} -> {request id: next token}.
Model = Callable[[dict[str, int]], dict[str, int]]


def echo_model(batch: dict[str, int]) -> dict[str, int]:
    """A stand-in model: the next token is the position it goes to."""
    return dict(batch)


class BlockPool:
    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self.free_ids = deque(range(num_blocks))

    @property
    def num_free(self) -> int:
        return len(self.free_ids)

    def allocate(self, n: int) -> list[int]:
        if n > len(self.free_ids):
            raise MemoryError(f"{n} blocks wanted, {len(self.free_ids)} free")
        return [self.free_ids.popleft() for _ in range(n)]

    def free(self, ids: list[int]) -> None:
        self.free_ids.extend(ids)


class Request:
    def __init__(self, req: EngineCoreRequest):
        self.request_id, self.prompt, self.max_tokens = (req.request_id, req.prompt_token_ids,
                                                         req.max_tokens)
        self.output: list[int] = []
        self.blocks: list[int] = []

    def blocks_needed(self) -> int:  # all of them up front: admission is the only wait
        return -(-(len(self.prompt) + self.max_tokens) // BLOCK_SIZE)


class EngineCore:
    def __init__(self, input_address: str, output_address: str, model: Model,
                 num_blocks: int, identity: bytes = b"\x00\x00"):
        self.model = model
        self.block_pool = BlockPool(num_blocks)
        self.waiting: deque[Request] = deque()
        self.running: dict[str, Request] = {}
        self.finished_ids: list[str] = []  # to report in the next EngineCoreOutputs
        self.input_queue: queue.Queue = queue.Queue()
        self.aborts_queue: queue.Queue = queue.Queue()
        self.output_queue: queue.Queue = queue.Queue()
        raise NotImplementedError("TODO: a context; start the input and the output thread")

    # --- IO threads: each owns its socket --------------------------------------------------
    def process_input_socket(self, address: str, identity: bytes) -> None:
        raise NotImplementedError("TODO: DEALER with the identity, READY, then decode each "
                                  "message onto input_queue (ABORT onto aborts_queue too)")

    def process_output_socket(self, address: str) -> None:
        raise NotImplementedError("TODO: PUSH; send each EngineCoreOutputs from output_queue "
                                  "until a None sentinel")

    # --- the scheduler's side ----------------------------------------------------------------
    def add_request(self, req: EngineCoreRequest) -> None:
        raise NotImplementedError("TODO: a Request, waiting for blocks")

    def abort_requests(self, request_ids: list[str]) -> list[str]:
        """Finish the ids that are waiting or running; others (unknown, finished) are ignored."""
        raise NotImplementedError("TODO: remove, free blocks, report each once in finished_ids")

    def has_work(self) -> bool:
        raise NotImplementedError("TODO: waiting, running, or finished ids not yet reported")

    def step(self) -> EngineCoreOutputs:
        raise NotImplementedError("TODO: admit, execute, apply aborts_queue, update")

    # --- the busy loop -----------------------------------------------------------------------
    def run_busy_loop(self) -> None:
        """Until SHUTDOWN: take client requests (blocking only when idle), then step."""
        raise NotImplementedError("TODO: input_queue, then step, outputs to output_queue; "
                                  "shutdown() on the way out")

    def shutdown(self) -> None:
        """Stop both IO threads (the output thread sends what is queued first), then term."""
        raise NotImplementedError("TODO")


def serve(input_address: str, output_address: str, num_blocks: int,
          identity: bytes = b"\x00\x00") -> None:
    """An engine process: the echo model, until SHUTDOWN."""
    EngineCore(input_address, output_address, echo_model, num_blocks, identity).run_busy_loop()
