"""EngineCoreProc: the engine core in its own process, a busy loop between two IO threads.

    input thread   DEALER per client --recv--> decode --> input_queue (and aborts_queue)
    main thread    busy loop: input_queue --> add/abort/utility; step(); outputs --> output_queue
    output thread  output_queue --> encode into a reused buffer --> PUSH per client

The sockets live in the IO threads, so the busy loop never waits on the network, and
decoding/encoding overlaps the model's forward pass (numpy and torch release the GIL).
The queues are `queue.SimpleQueue`: its put() is reentrant, so the SIGTERM/SIGINT handler can
wake an idle loop by putting WAKEUP (vLLM's Queue cannot be put to from a handler, whose
comment at vllm/v1/engine/core.py (EngineCoreProc.run_engine_core) explains why, and needs a helper thread).

Faults: a message that does not decode, or a request the engine refuses, never stops the loop.
A request whose id is known gets an output with FinishReason.ERROR and the reason; anything
else is logged and dropped. A fatal error (an exception in the loop, a worker death) sends the
raw frame ENGINE_CORE_DEAD to every client and exits with code 1.
The IO threads live in core_io.py. In vLLM: EngineCoreProc in vllm/v1/engine/core.py (its
run_busy_loop, _send_engine_dead, run_engine_core).
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import threading
import traceback
from typing import Any

import msgspec
import zmq

from minivllm.engine.config import EngineConfig
from minivllm.engine.core import EngineCore
from minivllm.engine.core_io import EngineCoreIOMixin, InvalidRequest
from minivllm.engine.messages import (
    EngineCoreOutput, EngineCoreOutputs, EngineCoreReadyResponse, EngineCoreRequestType,
    FinishReason, UtilityOutput, UtilityRequest)
from minivllm.engine.messages import (
    ADDRESSES_TIMEOUT_S, EngineZmqAddresses, HandshakeFailed, HandshakeHello, HandshakeReady)
from minivllm.utils import tracing
from minivllm.utils.mp_child import ChildLink
from minivllm.utils.zmq import close_all, dp_rank_identity, make_zmq_socket

logger = logging.getLogger(__name__)

RT = EngineCoreRequestType
IO_READY_TIMEOUT_S = 30.0  # the IO threads connect their sockets; seconds would mean stuck
STOP_POLL_S = 0.1  # the handshake's wait looks at the stop flag this often


class EngineCoreProc(EngineCoreIOMixin, EngineCore):
    def __init__(self, config: EngineConfig, engine_index: int,
                 addresses: EngineZmqAddresses) -> None:
        self.engine_index = engine_index
        self.input_queue: queue.SimpleQueue = queue.SimpleQueue()
        self.aborts_queue: queue.SimpleQueue = queue.SimpleQueue()
        self.output_queue: queue.SimpleQueue = queue.SimpleQueue()
        self.shutdown_requested = False
        self.num_clients = len(addresses.outputs)
        self.client_of: dict[str, int] = {}  # running request id -> the client to answer
        self.num_dropped = 0
        super().__init__(config)  # model, KV cache, executor (its workers start before our threads)
        # a worker died: fatal, handled on the busy loop's thread
        self.model_executor.register_failure_callback(
            lambda: self.input_queue.put((RT.EXECUTOR_FAILED, None)))
        identity = dp_rank_identity(engine_index)
        io_ready = threading.Event()
        self.input_thread = threading.Thread(
            target=self.process_input_sockets, args=(addresses.inputs, identity, io_ready),
            name="EngineCoreInputThread", daemon=True)
        self.output_thread = threading.Thread(
            target=self.process_output_sockets, args=(addresses.outputs,),
            name="EngineCoreOutputThread", daemon=True)
        self.input_thread.start()
        self.output_thread.start()
        if not io_ready.wait(IO_READY_TIMEOUT_S):
            raise TimeoutError(f"engine core {engine_index}: the input thread did not connect "
                               f"to {addresses.inputs} within {IO_READY_TIMEOUT_S:g} s")

    def ready_response(self) -> EngineCoreReadyResponse:
        return EngineCoreReadyResponse(self.engine_index, self.config.num_kv_blocks,
                                       self.config.block_size, self.config.max_model_len)

    def wake_up(self) -> None:
        """Unblock an idle busy loop (safe in a signal handler: SimpleQueue.put is reentrant)."""
        self.input_queue.put((RT.WAKEUP, None))

    # --- the busy loop (main thread) --------------------------------------------------------
    def run_busy_loop(self) -> None:
        while not self.shutdown_requested:
            self._process_input_queue()
            if self.shutdown_requested:
                break
            self._process_engine_step()
        self._abort_all("the engine core was shut down")

    def _process_input_queue(self) -> None:
        while not self.has_unfinished_requests() and not self.shutdown_requested:
            self._handle_client_request(*self.input_queue.get())  # idle: block, 0% CPU
        while not self.input_queue.empty():
            self._handle_client_request(*self.input_queue.get_nowait())

    def _process_engine_step(self) -> None:
        outputs = self.step()
        if not outputs.outputs:
            return
        if self.num_clients == 1:
            for req_id in outputs.finished_requests:
                self.client_of.pop(req_id, None)
            self.output_queue.put((0, outputs))
            return
        by_client: dict[int, EngineCoreOutputs] = {}
        for out in outputs.outputs:
            client = self.client_of.get(out.request_id, 0)
            if out.finished:
                self.client_of.pop(out.request_id, None)
            per = by_client.setdefault(client, EngineCoreOutputs(timestamp=outputs.timestamp))
            per.outputs.append(out)
            if out.finished:
                per.finished_requests.append(out.request_id)
        for client, per in by_client.items():
            self.output_queue.put((client, per))

    def process_aborts_during_step(self) -> None:
        ids: list[str] = []
        while not self.aborts_queue.empty():
            ids.extend(self.aborts_queue.get_nowait())
        if ids:  # the same ABORT also waits in input_queue, where it is applied again: harmless
            self._abort(ids)

    def _abort(self, request_ids: list[str]) -> None:
        self.abort_requests(request_ids)
        for req_id in request_ids:
            self.client_of.pop(req_id, None)

    def _handle_client_request(self, request_type: RT, request: Any) -> None:
        if request_type == RT.ADD:
            if isinstance(request, InvalidRequest):
                self._refuse(request.request_id, request.client_index, request.reason)
                return
            try:
                self.add_request(request)
            except Exception as e:  # noqa: BLE001 - a request's fault is that request's alone
                self._refuse(request.request_id, request.client_index,
                             str(e) if isinstance(e, ValueError) else f"{type(e).__name__}: {e}")
                return
            self.client_of[request.request_id] = request.client_index
        elif request_type == RT.ABORT:
            self._abort(request)
        elif request_type == RT.UTILITY:
            self._handle_utility(request)
        elif request_type == RT.EXECUTOR_FAILED:
            raise RuntimeError(f"engine core {self.engine_index}: a worker of the executor died")
        # WAKEUP: nothing to do, the loop looks at its flags again

    def _refuse(self, request_id: str, client_index: int, reason: str) -> None:
        """An error output for a request the engine will not run; never for a running id, whose
        client would take the error as the end of its real request."""
        if request_id in self.scheduler.requests:
            self._log_drop(f"a second request with the running id {request_id!r}: {reason}")
            return
        logger.warning("engine core %d refused request %r: %s", self.engine_index,
                       request_id, reason)
        error = EngineCoreOutput(request_id, [], FinishReason.ERROR, error=reason)
        self.output_queue.put((client_index, EngineCoreOutputs(
            outputs=[error], finished_requests=[request_id])))

    def _handle_utility(self, request: UtilityRequest) -> None:
        reply = UtilityOutput(request.call_id)
        try:
            reply.result = self.call_utility(request.method, request.args)
            msgspec.msgpack.encode(reply.result)  # fail here, not in the output thread
        except Exception as e:
            reply.result, reply.failure_message = None, f"{type(e).__name__}: {e}"
        self.output_queue.put((request.client_index, EngineCoreOutputs(utility_output=reply)))

    def _abort_all(self, reason: str) -> None:
        """At shutdown: end every request with FinishReason.ABORT so no caller waits for it."""
        by_client: dict[int, list[EngineCoreOutput]] = {}
        for req_id in list(self.scheduler.requests):
            out = EngineCoreOutput(req_id, [], FinishReason.ABORT, error=reason)
            by_client.setdefault(self.client_of.get(req_id, 0), []).append(out)
        self._abort(list(self.scheduler.requests))
        for client, outs in by_client.items():
            self.output_queue.put((client, EngineCoreOutputs(
                outputs=outs, finished_requests=[o.request_id for o in outs])))

def _wait_for_addresses(handshake: zmq.Socket, stop: threading.Event) -> bool:
    """Poll in slices, so that SIGTERM ends the wait (pyzmq resumes a poll after a signal)."""
    for _ in range(int(ADDRESSES_TIMEOUT_S / STOP_POLL_S)):
        if handshake.poll(STOP_POLL_S * 1000) or stop.is_set():
            return not stop.is_set()
    return False


def run_engine_core(link: ChildLink, config: EngineConfig, engine_index: int,
                    handshake_address: str) -> None:
    """The engine core process's target (utils.mp.launch): handshake, then the busy loop."""
    from setproctitle import setproctitle

    setproctitle(f"MINIVLLM::EngineCore_{engine_index}")
    tracing.set_process_name(f"MINIVLLM::EngineCore_{engine_index}")
    link.ready()  # the process runs; the ZMQ handshake below reports the rest
    engine: EngineCoreProc | None = None
    stop = threading.Event()

    def request_shutdown(*_: Any) -> None:  # SIGTERM, SIGINT, or the parent's stop request
        stop.set()
        if engine is not None:
            engine.shutdown_requested = True
            engine.wake_up()

    signal.signal(signal.SIGTERM, request_shutdown)
    signal.signal(signal.SIGINT, request_shutdown)
    threading.Thread(target=lambda: (link.wait_stop(), request_shutdown()), daemon=True,
                     name="EngineCoreStopWatcher").start()
    ctx = zmq.Context()
    handshake = make_zmq_socket(ctx, handshake_address, zmq.DEALER, bind=False,
                                identity=dp_rank_identity(engine_index), linger=1000)
    try:
        handshake.send(msgspec.msgpack.encode(HandshakeHello(engine_index, os.getpid())))
        if not _wait_for_addresses(handshake, stop):
            if stop.is_set():  # stopped while waiting (a headless node whose leader is not up)
                return
            raise TimeoutError(f"engine core {engine_index} waited {ADDRESSES_TIMEOUT_S:g} s for "
                               f"the launcher's addresses on {handshake_address}")
        addresses = msgspec.msgpack.decode(handshake.recv(), type=EngineZmqAddresses)
        try:
            engine = EngineCoreProc(config, engine_index, addresses)
        except BaseException:
            handshake.send(msgspec.msgpack.encode(HandshakeFailed(traceback.format_exc())))
            raise
        handshake.send(msgspec.msgpack.encode(HandshakeReady(engine.ready_response())))
    finally:
        close_all(handshake, linger=1000)
        ctx.term()
    if stop.is_set():
        request_shutdown()
    try:
        engine.run_busy_loop()
    except BaseException:
        logger.exception("engine core %d hit a fatal error; telling its clients", engine_index)
        engine.send_engine_dead()
        raise
    engine.stop_output_thread()
    engine.shutdown()
