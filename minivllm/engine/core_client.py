"""The front end's handle on the engine core: in this process, or in engine core processes.

    client = EngineCoreClient.make_client(config, asyncio_mode=False, multiprocess=True)
    client.add_request(request); outputs = client.get_output(); client.shutdown()

The MP clients bind one ROUTER (requests out, by engine identity) and one PULL (outputs in),
shared by all data-parallel engines. Engine i's DEALER has the identity i as 2 bytes little
endian (vllm/v1/engine/core.py (EngineCoreProc.__init__)). A request goes to the engine with the fewest requests in
flight from this client; its aborts follow it (reqs_in_flight). vLLM balances DP differently:
DPLBAsyncMPClient, vllm/v1/engine/core_client.py (DPLBAsyncMPClient.get_core_engine_for_request), and chapter 07.

Death. A monitor thread waits on the engines' process sentinels (or pidfds, for engines that
another process started); the output side also recognises the ENGINE_CORE_DEAD frame. Engines
on other nodes (tcp addresses) have neither: a PeerWatch hears their connections drop. Either
way every blocked and every later call raises EngineDeadError: the error is queued after the
outputs already received, and a getter that takes it puts it back for the next one, so no
caller can be left waiting (vLLM's sync output thread leaves on shutdown without queueing an
error, SyncMPClient's output thread; its get_output() then waits forever).
In vLLM: vllm/v1/engine/core_client.py: EngineCoreClient, InprocClient, MPClient (its
monitor_engine_cores), SyncMPClient, AsyncMPClient, DPAsyncMPClient, DPLBAsyncMPClient.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing.connection
import os
import threading
import time
import weakref
from typing import Any

import zmq

from minivllm.distributed.peer_watch import PeerWatch
from minivllm.engine.client_resources import ClientResources
from minivllm.engine.config import EngineConfig
from minivllm.engine.core import EngineCore
from minivllm.engine.core_io import HEARTBEAT
from minivllm.engine.exceptions import EngineDeadError
from minivllm.engine.messages import (
    ENGINE_CORE_DEAD, EngineCoreOutputs, EngineCoreReadyResponse, EngineCoreRequest,
    EngineCoreRequestType, UtilityOutput, UtilityRequest)
from minivllm.engine.launcher import CoreEngineProcManager, launch_core_engines
from minivllm.engine.messages import ClientAddresses
from minivllm.serial import MsgpackDecoder, MsgpackEncoder
from minivllm.utils.zmq import dp_rank_identity, identity_to_rank, make_zmq_socket

logger = logging.getLogger(__name__)

RT = EngineCoreRequestType
REGISTER_TIMEOUT_S = 60.0  # engines connect their DEALERs to our ROUTER within this


class EngineCoreClient:
    """The interface LLM and AsyncLLM use; make_client picks the implementation."""

    @staticmethod
    def make_client(config: EngineConfig, asyncio_mode: bool, multiprocess: bool,
                    client_addresses: ClientAddresses | None = None, client_index: int = 0
                    ) -> "EngineCoreClient":
        if not multiprocess:
            if asyncio_mode:
                raise ValueError("AsyncLLM needs the engine core in its own process")
            return InprocClient(config)
        from minivllm.engine.core_client_mp import AsyncMPClient, SyncMPClient

        cls = AsyncMPClient if asyncio_mode else SyncMPClient
        return cls(config, client_addresses, client_index)


class InprocClient(EngineCoreClient):
    """The engine core in the caller's process: get_output() is one step."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.engine_core = EngineCore(config)
        self._closed = False

    def add_request(self, request: EngineCoreRequest) -> None:
        self.engine_core.add_request(request)

    def abort_requests(self, request_ids: list[str]) -> None:
        self.engine_core.abort_requests(request_ids)

    def get_output(self) -> EngineCoreOutputs:
        return self.engine_core.step()

    def call_utility(self, method: str, *args: Any) -> Any:
        return self.engine_core.call_utility(method, list(args))

    def call_utility_all(self, method: str, *args: Any) -> list:
        return [self.call_utility(method, *args)]

    def shutdown(self) -> None:
        if not self._closed:
            self._closed = True
            self.engine_core.shutdown()


class MPClient(EngineCoreClient):
    """What the sync and async MP clients share: start-up, routing, death. Subclasses own the
    output side (a thread or an asyncio task) and implement _wake_waiters."""

    def __init__(self, config: EngineConfig, client_addresses: ClientAddresses | None,
                 client_index: int, ctx: zmq.Context) -> None:
        self.config, self.client_index = config, client_index
        self.dead_error: EngineDeadError | None = None
        self._closing = False
        self._lock = threading.Lock()  # dead_error, the utility futures, the send side
        self.ctx, self.resources = ctx, ClientResources(ctx)
        self._finalizer = weakref.finalize(self, self.resources.release)
        self.engine_manager: CoreEngineProcManager | None = None
        self.input_socket = self.output_socket = None
        try:
            if client_addresses is None:
                self.engine_manager, addresses = launch_core_engines(config)
                self.resources.engine_manager = self.engine_manager
                client_addresses = addresses.for_client(
                    0, listeners=self.engine_manager.client_listeners(0))
                watch = self.engine_manager.sentinels
            else:
                watch = [os.pidfd_open(p) for p in client_addresses.engine_pids]
                self.resources.owned_fds = watch
            input_address = client_addresses.input_address
            listen_in, listen_out = client_addresses.listeners or (None, None)
            remote = input_address.startswith("tcp://")  # engines on other nodes, maybe
            self.input_socket = self.resources.input_socket = make_zmq_socket(
                ctx, input_address, zmq.ROUTER, bind=True, linger=0,
                heartbeat=HEARTBEAT if remote else None, listener=listen_in)
            self.output_socket = self.resources.output_socket = make_zmq_socket(
                ctx, client_addresses.output_address, zmq.PULL, bind=True, linger=0,
                listener=listen_out)
            ranks = config.client_engine_ranks  # all DP ranks, or this node's (hybrid, external)
            self.ready_responses = self._wait_for_engines(ranks)
        except BaseException:
            self._finalizer()
            raise
        self.core_engines = [dp_rank_identity(r) for r in ranks]
        self.in_flight = [0] * len(self.core_engines)  # requests in flight, per engine
        self.reqs_in_flight: dict[str, int] = {}  # request id -> engine rank
        self.encoder = MsgpackEncoder()
        self.decoder = MsgpackDecoder(EngineCoreOutputs)
        self.utility_results: dict[int, Any] = {}  # call id -> future
        self._call_ids = itertools.count()
        self.start_thread(_monitor_engines, "EngineCoreMonitor", watch, self.resources.stop_r)
        if remote:
            self._watch_connections()

    def _watch_connections(self) -> None:
        """Engines on other nodes have no sentinel here: a dropped connection of the ROUTER
        (the engine's kernel closed it: milliseconds; or heartbeats went unanswered for
        HEARTBEAT_TIMEOUT_MS) is an engine's death. Engines never disconnect while we run."""
        client_ref = weakref.ref(self)

        def on_lost(_key: object, endpoint: str) -> None:
            client = client_ref()
            if client is not None and not client._closing:
                client.set_dead(EngineDeadError(
                    f"an engine core's connection to {endpoint} closed or fell silent for "
                    f"{HEARTBEAT[1] / 1000:g} s (the engine or its node died, or the link went "
                    "down): every request in flight is lost. Restart the engines."))

        watch = PeerWatch({"engines": self.input_socket}, on_lost, name="EngineCoreConnWatch")
        self.resources.stoppers.append(watch.stop)

    def start_thread(self, fn: Any, name: str, *args: Any) -> None:
        """A daemon thread running fn(weak reference to this client, *args), released with it.
        fork_safe: it blocks in poll(2) and holds no lock that a forked child could need."""
        t = threading.Thread(target=fn, args=(weakref.ref(self), *args), name=name, daemon=True)
        t.fork_safe = True
        self.resources.threads.append(t)
        t.start()

    def _wait_for_engines(self, ranks: range) -> list[EngineCoreReadyResponse]:
        """Each engine's DEALER says hello first: until then the ROUTER would drop our sends."""
        sync = zmq.Socket.shadow(self.input_socket.underlying)
        decoder, responses = MsgpackDecoder(EngineCoreReadyResponse), {}
        deadline = time.monotonic() + REGISTER_TIMEOUT_S
        while len(responses) < len(ranks):
            if not sync.poll(max(deadline - time.monotonic(), 0) * 1000):
                missing = sorted(set(ranks) - responses.keys())
                raise TimeoutError(f"engine core(s) {missing} did not connect to "
                                   f"{sync.getsockopt_string(zmq.LAST_ENDPOINT)} within "
                                   f"{REGISTER_TIMEOUT_S:g} s: are they running?")
            identity, *frames = sync.recv_multipart()
            responses[identity_to_rank(identity)] = decoder.decode(frames)
        return [responses[r] for r in ranks]

    # --- routing ----------------------------------------------------------------------------
    def _choose_engine(self, request: EngineCoreRequest) -> int:
        if request.request_id in self.reqs_in_flight:
            raise ValueError(f"request id {request.request_id!r} is already in flight")
        rank = min(range(len(self.in_flight)), key=self.in_flight.__getitem__)
        self.reqs_in_flight[request.request_id] = rank
        self.in_flight[rank] += 1
        request.client_index = self.client_index
        return rank

    def _forget(self, request_ids: list[str]) -> dict[int, list[str]]:
        """Drop finished or aborted requests from the books; returns them grouped by engine."""
        by_engine: dict[int, list[str]] = {}
        for req_id in request_ids:
            rank = self.reqs_in_flight.pop(req_id, None)
            if rank is not None:
                self.in_flight[rank] -= 1
                by_engine.setdefault(rank, []).append(req_id)
        return by_engine

    def _add_frames(self, request: EngineCoreRequest) -> list:
        self.ensure_alive()
        rank = self._choose_engine(request)
        return [self.core_engines[rank], RT.ADD.value, *self.encoder.encode(request)]

    def _abort_frames(self, request_ids: list[str]) -> list[list]:
        self.ensure_alive()
        return [[self.core_engines[rank], RT.ABORT.value, *self.encoder.encode(ids)]
                for rank, ids in self._forget(request_ids).items()]

    def _utility_frames(self, rank: int, method: str, args: tuple, future: Any) -> list:
        with self._lock:
            self.ensure_alive()
            call_id = next(self._call_ids)
            self.utility_results[call_id] = future
        request = UtilityRequest(call_id, method, list(args), self.client_index)
        return [self.core_engines[rank], RT.UTILITY.value, *self.encoder.encode(request)]

    def _decode_output(self, frames: list) -> EngineCoreOutputs | None:
        """Frames from the PULL to outputs; None for a utility reply (its future is resolved)."""
        if len(frames) == 1 and frames[0].bytes == ENGINE_CORE_DEAD:
            raise EngineDeadError("an engine core reported a fatal error and exited: see its "
                                  "traceback in the log above")
        outputs = self.decoder.decode(frames)
        if outputs.utility_output is not None:
            self._resolve_utility(outputs.utility_output)
            return None
        return outputs

    def _resolve_utility(self, reply: UtilityOutput) -> None:
        with self._lock:
            future = self.utility_results.pop(reply.call_id, None)
        if future is None:
            return
        if reply.failure_message is not None:
            self._set_future(future, exception=RuntimeError(
                f"utility call failed in the engine core: {reply.failure_message}"))
        else:
            self._set_future(future, result=reply.result)

    def _record_finished(self, outputs: EngineCoreOutputs) -> None:
        if outputs.finished_requests:
            self._forget(outputs.finished_requests)

    # --- death --------------------------------------------------------------------------
    def ensure_alive(self) -> None:
        if self.dead_error is not None:
            raise self.dead_error

    @property
    def errored(self) -> bool:
        return self.dead_error is not None

    def _on_engine_exit(self, index: int) -> None:
        if self._closing:
            return
        if self.engine_manager is not None:
            what = self.engine_manager.describe_death(index)
        else:
            what = f"engine core {index} exited"
        self.set_dead(EngineDeadError(f"{what}: every request in flight is lost; see its log "
                                      "above. Restart the engine."))

    def set_dead(self, error: EngineDeadError) -> None:
        """Fail every pending call and every later one with `error` (first error wins)."""
        with self._lock:
            if self.dead_error is not None:
                return
            self.dead_error = error
            futures, self.utility_results = list(self.utility_results.values()), {}
        if not self._closing:
            logger.error("%s", error)
        for future in futures:
            self._set_future(future, exception=error)
        self._wake_waiters(error)

    def _set_future(self, future: Any, result: Any = None, exception: BaseException | None = None
                    ) -> None:
        raise NotImplementedError

    def _wake_waiters(self, error: EngineDeadError) -> None:
        raise NotImplementedError

    def _begin_shutdown(self) -> bool:
        """True the first time: fail what waits (and every later call) with EngineDeadError."""
        with self._lock:
            if self._closing:
                return False
            self._closing = True
        self.set_dead(EngineDeadError("the engine client was shut down"))
        return True


def _monitor_engines(client_ref: "weakref.ref[MPClient]", watched: list, stop_r: int) -> None:
    """Wait for an engine's exit or the stop pipe, holding the client only weakly."""
    ready = multiprocessing.connection.wait(watched + [stop_r])
    client = client_ref()
    if client is not None and stop_r not in ready:
        client._on_engine_exit(next(i for i, fd in enumerate(watched) if fd in ready))
