"""Exercise 402, reference answer: an engine core's IO threads and its abort path.

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
POLL_MS = 20  # how often the IO threads look at their stop flag  # pragma: no mutate


class EngineCoreRequest(msgspec.Struct):  # pragma: no mutate block
    request_id: str
    prompt_token_ids: list[int]
    max_tokens: int


class EngineCoreOutput(msgspec.Struct):  # pragma: no mutate block
    request_id: str
    new_token_ids: list[int]
    finish_reason: str | None = None  # "length" on the last token


class EngineCoreOutputs(msgspec.Struct):  # pragma: no mutate block
    outputs: list[EngineCoreOutput]
    finished_requests: list[str]  # finished since the last outputs, aborted ones included


# The model: {request id: tokens it has so far (prompt + outputs)} -> {request id: next token}.
Model = Callable[[dict[str, int]], dict[str, int]]  # pragma: no mutate


def echo_model(batch: dict[str, int]) -> dict[str, int]:  # pragma: no mutate block
    """A stand-in model: the next token is the position it goes to."""
    return dict(batch)


class BlockPool:  # pragma: no mutate block
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


class Request:  # pragma: no mutate block
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
        self.ctx = zmq.Context()
        self._stop = threading.Event()
        self.threads = [
            threading.Thread(target=self.process_input_socket, args=(input_address, identity),
                             name="engine-input", daemon=True),
            threading.Thread(target=self.process_output_socket, args=(output_address,),
                             name="engine-output", daemon=True)]
        for t in self.threads:
            t.start()

    # --- IO threads: each owns its socket --------------------------------------------------
    def process_input_socket(self, address: str, identity: bytes) -> None:
        decode_add = msgspec.msgpack.Decoder(EngineCoreRequest).decode
        decode_ids = msgspec.msgpack.Decoder(list[str]).decode
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, identity)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.connect(address)
            sock.send(READY)
            while not self._stop.is_set():
                if not sock.poll(POLL_MS):
                    continue
                kind, *data = sock.recv_multipart()
                if kind == ADD:
                    self.input_queue.put((ADD, decode_add(data[0])))
                elif kind == ABORT:
                    ids = decode_ids(data[0])
                    self.aborts_queue.put(ids)  # for the step in progress
                    self.input_queue.put((ABORT, ids))  # and in order with the adds
                elif kind == SHUTDOWN:
                    self.input_queue.put((SHUTDOWN, None))
        finally:
            sock.close()

    def process_output_socket(self, address: str) -> None:
        encode = msgspec.msgpack.Encoder().encode
        sock = self.ctx.socket(zmq.PUSH)
        sock.setsockopt(zmq.LINGER, 1000)
        try:
            sock.connect(address)
            while True:
                outputs = self.output_queue.get()
                if outputs is None:
                    return
                sock.send(encode(outputs))
        finally:
            sock.close()

    # --- the scheduler's side ----------------------------------------------------------------
    def add_request(self, req: EngineCoreRequest) -> None:
        self.waiting.append(Request(req))

    def abort_requests(self, request_ids: list[str]) -> list[str]:
        """Finish the ids that are waiting or running; others (unknown, finished) are ignored."""
        aborted = []
        for rid in request_ids:
            if (req := self.running.pop(rid, None)) is not None:
                self.block_pool.free(req.blocks)
            elif (req := next((r for r in self.waiting if r.request_id == rid), None)):
                self.waiting.remove(req)
            else:
                continue
            aborted.append(rid)
            self.finished_ids.append(rid)
        return aborted

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.finished_ids)

    def _admit(self) -> None:
        while self.waiting and self.waiting[0].blocks_needed() <= self.block_pool.num_free:
            req = self.waiting.popleft()
            req.blocks = self.block_pool.allocate(req.blocks_needed())
            self.running[req.request_id] = req

    def _process_aborts_queue(self) -> None:
        while True:
            try:
                self.abort_requests(self.aborts_queue.get_nowait())
            except queue.Empty:
                return

    def step(self) -> EngineCoreOutputs:
        self._admit()
        batch = {rid: len(r.prompt) + len(r.output) for rid, r in self.running.items()}
        sampled = self.model(batch) if batch else {}
        self._process_aborts_queue()  # aborts that arrived while the model ran
        outputs = []
        for rid, token in sampled.items():
            req = self.running.get(rid)
            if req is None:  # aborted during execute: its token is dropped
                continue
            req.output.append(token)
            done = len(req.output) >= req.max_tokens
            outputs.append(EngineCoreOutput(rid, [token], "length" if done else None))
            if done:
                del self.running[rid]
                self.block_pool.free(req.blocks)
                self.finished_ids.append(rid)
        finished, self.finished_ids = self.finished_ids, []
        return EngineCoreOutputs(outputs, finished)

    # --- the busy loop -----------------------------------------------------------------------
    def _handle(self, kind: bytes, payload) -> bool:
        """Apply one client request; False on SHUTDOWN."""
        if kind == ADD:
            self.add_request(payload)
        elif kind == ABORT:
            self.abort_requests(payload)
        return kind != SHUTDOWN

    def run_busy_loop(self) -> None:
        """Until SHUTDOWN: take client requests (blocking only when idle), then step."""
        try:
            while True:
                while not self.has_work():
                    with self.aborts_queue.mutex:  # idle: every abort is in input_queue too
                        self.aborts_queue.queue.clear()
                    if not self._handle(*self.input_queue.get()):
                        return
                while not self.input_queue.empty():
                    if not self._handle(*self.input_queue.get_nowait()):
                        return
                outputs = self.step()
                if outputs.outputs or outputs.finished_requests:
                    self.output_queue.put(outputs)
        finally:
            self.shutdown()

    def shutdown(self) -> None:
        """Stop both IO threads (the output thread sends what is queued first), then term."""
        if self.ctx.closed:
            return
        self._stop.set()
        self.output_queue.put(None)
        for t in self.threads:
            if t is not threading.current_thread():
                t.join()
        self.ctx.term()


def serve(input_address: str, output_address: str, num_blocks: int,
          identity: bytes = b"\x00\x00") -> None:  # pragma: no mutate block
    """An engine process: the echo model, until SHUTDOWN."""
    EngineCore(input_address, output_address, echo_model, num_blocks, identity).run_busy_loop()
