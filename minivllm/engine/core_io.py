"""The engine core's two IO threads: sockets stay off the busy loop.

EngineCoreProc mixes this in (as mini-sglang keeps transport out of its scheduler in a mixin,
python/minisgl/scheduler/io.py). The input thread polls one DEALER per client and decodes onto
`input_queue` (ABORTs also onto `aborts_queue`, applied right after the running step); the
output thread encodes what the busy loop puts on `output_queue` into one reused buffer and
sends it on the PUSH of the client it belongs to. Neither may die of a bad message: what does not
decode is logged and dropped, or, when its request id can be read, answered with an error.
In vLLM: vllm/v1/engine/core.py (EngineCoreProc.process_input_sockets), process_output_sockets.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

import msgspec
import zmq

from minivllm.distributed.peer_watch import PeerWatch
from minivllm.distributed.shm_broadcast import HEARTBEAT_IVL_MS, HEARTBEAT_TIMEOUT_MS
from minivllm.engine.messages import (
    ENGINE_CORE_DEAD, EngineCoreOutputs, EngineCoreRequest, EngineCoreRequestType,
    UtilityOutput, UtilityRequest)
from minivllm.serial import DecodeError, MsgpackDecoder, MsgpackEncoder
from minivllm.utils import tracing
from minivllm.utils.zmq import close_all, make_zmq_socket

logger = logging.getLogger(__name__)

RT = EngineCoreRequestType
OUTPUT_LINGER_MS = 4000  # at exit, queued outputs (and ENGINE_CORE_DEAD) get this to leave
STOP_OUTPUT = object()  # put on the output queue at a clean exit
# Engines on other nodes than their front end: ZMTP heartbeats on the tcp connections, so that
# a front end whose host or link vanished (no FIN) is noticed after HEARTBEAT_TIMEOUT_MS.
HEARTBEAT = (HEARTBEAT_IVL_MS, HEARTBEAT_TIMEOUT_MS)
FRONT_END_GONE_GRACE_S = OUTPUT_LINGER_MS / 1000 + 6  # the loop's exit, then the outputs' linger
_LOG_FIRST_DROPS, _LOG_EVERY_DROPS = 10, 1000  # a flood of garbage must not flood the log


class InvalidRequest(msgspec.Struct):
    """Put on the input queue for an ADD that did not decode but whose request id could be read."""

    request_id: str
    client_index: int
    reason: str



class EngineCoreIOMixin:
    """Needs: engine_index, input_queue, aborts_queue, output_queue, output_thread,
    num_dropped, shutdown_requested, ready_response(), wake_up()."""

    def _log_drop(self, what: str) -> None:
        self.num_dropped += 1
        n = self.num_dropped
        if n <= _LOG_FIRST_DROPS or n % _LOG_EVERY_DROPS == 0:
            logger.warning("engine core %d dropped %s (%d dropped so far)", self.engine_index,
                           what, n)

    # --- the input thread ---------------------------------------------------------------
    def process_input_sockets(self, addresses: list[str], identity: bytes,
                              ready: threading.Event) -> None:
        decoders = {RT.ADD: MsgpackDecoder(EngineCoreRequest), RT.ABORT: MsgpackDecoder(list[str]),
                    RT.UTILITY: MsgpackDecoder(UtilityRequest)}
        ctx = zmq.Context()
        remote = any(a.startswith("tcp://") for a in addresses)  # engines on several nodes
        sockets = [make_zmq_socket(ctx, a, zmq.DEALER, bind=False, identity=identity, linger=0,
                                   heartbeat=HEARTBEAT if remote else None) for a in addresses]
        if remote:
            PeerWatch(dict(enumerate(sockets)), self._on_front_end_lost,
                      name="EngineCoreFrontEndWatch")
        hello = MsgpackEncoder().encode(self.ready_response())
        poller = zmq.Poller()
        for sock in sockets:
            sock.send_multipart(hello)  # a ROUTER can route only to a peer it has heard from
            poller.register(sock, zmq.POLLIN)
        ready.set()
        while True:  # a daemon thread: it ends with the process
            for sock, _ in poller.poll():
                frames = sock.recv_multipart(copy=False)
                try:
                    with tracing.span("input"):
                        self._receive(sockets.index(sock), frames, decoders)
                except Exception as e:  # noqa: BLE001 - this thread must outlive any message
                    self._log_drop(f"a message that broke the input thread: {e!r}")

    def _on_front_end_lost(self, client_index: int, endpoint: str) -> None:
        """A front end on another node exited, was killed, or fell silent: stop, as at SIGTERM
        (a headless node's engines end with their leader), or exit if the loop is stuck."""
        logger.warning("engine core %d lost its front end at %s: shutting down",
                       self.engine_index, endpoint)
        self.shutdown_requested = True
        self.wake_up()
        time.sleep(FRONT_END_GONE_GRACE_S)
        os._exit(0)  # still here (a daemon thread): the clean exit did not come

    def _receive(self, client_index: int, frames: list, decoders: dict) -> None:
        """Decode one message onto the queues; never raises (a bad message must not end us)."""
        try:
            request_type = RT(frames[0].bytes)
        except ValueError:
            self._log_drop(f"a message with type byte {frames[0].bytes[:8]!r}")
            return
        decoder = decoders.get(request_type)
        if decoder is None:  # EXECUTOR_FAILED, WAKEUP, ...: the engine's own, never a client's
            self._log_drop(f"a {request_type.name} message from a client")
            return
        try:
            request = decoder.decode(frames[1:])
        except DecodeError as e:
            self._undecodable(request_type, client_index, frames[1:], e)
            return
        if request_type == RT.ABORT:
            self.aborts_queue.put(request)  # applied right after the step that runs now
        elif request_type in (RT.ADD, RT.UTILITY):
            request.client_index = client_index  # the socket says who sent it
        self.input_queue.put((request_type, request))

    def _undecodable(self, request_type: RT, client_index: int, frames: list,
                     error: DecodeError) -> None:
        head = _peek_first_field(frames)
        if request_type == RT.ADD and isinstance(head, str):
            self.input_queue.put((RT.ADD, InvalidRequest(head, client_index, str(error))))
        elif request_type == RT.UTILITY and isinstance(head, int):
            reply = UtilityOutput(head, failure_message=f"bad utility request: {error}")
            self.output_queue.put((client_index, EngineCoreOutputs(utility_output=reply)))
        else:
            self._log_drop(f"an undecodable {request_type.name}: {error}")

    # --- the output thread --------------------------------------------------------------
    def process_output_sockets(self, addresses: list[str]) -> None:
        encoder = MsgpackEncoder()
        buffer = bytearray()  # reused: zmq copies a small body when it sends it
        ctx = zmq.Context()
        sockets = [make_zmq_socket(ctx, a, zmq.PUSH, bind=False, linger=OUTPUT_LINGER_MS)
                   for a in addresses]
        try:
            while True:
                item = self.output_queue.get()
                if item is ENGINE_CORE_DEAD:
                    for sock in sockets:
                        sock.send(ENGINE_CORE_DEAD)
                    break
                if item is STOP_OUTPUT:
                    break
                client, outputs = item
                outputs.engine_index = self.engine_index
                with tracing.span("output"):
                    frames = encoder.encode_into(outputs, buffer)
                    if len(frames) == 1:
                        sockets[client].send(buffer, copy=True)
                    else:  # large arrays out of band, no copies; the buffer goes with them
                        sockets[client].send_multipart(frames, copy=False)
                        buffer = bytearray()
        finally:
            close_all(*sockets, linger=OUTPUT_LINGER_MS)
            ctx.term()

    def send_engine_dead(self) -> None:
        self.output_queue.put(ENGINE_CORE_DEAD)
        self.output_thread.join(OUTPUT_LINGER_MS / 1000 + 1)

    def stop_output_thread(self) -> None:
        self.output_queue.put(STOP_OUTPUT)
        self.output_thread.join(OUTPUT_LINGER_MS / 1000 + 1)


def _peek_first_field(frames: list) -> Any:
    """The first field of a msgpack array body (a request id, a call id), or None."""
    try:
        value = msgspec.msgpack.decode(frames[0].bytes)
    except Exception:
        return None
    head = value[0] if isinstance(value, list) and value else None
    return head if isinstance(head, (str, int)) and not isinstance(head, bool) else None
