"""The engine launcher: starting engine core processes, and the start-up handshake (its
messages are in messages.py). vLLM keeps the same code in vllm/v1/engine/utils.py.

    engine_manager, addresses = launch_core_engines(config, num_api_servers=1)
    # client i binds a ROUTER at addresses.inputs[i] and a PULL at addresses.outputs[i]
    engine_manager.close()   # stops the engines, removes the ipc socket files

The handshake runs over one ROUTER that the launcher binds; each engine connects a DEALER whose
identity is its DP rank (2 bytes, little endian):

    step  engine -> launcher             launcher -> engine       the launcher waits at most
    1     HandshakeHello(rank, pid)                                HELLO_TIMEOUT_S (imports)
    2                                    EngineZmqAddresses
    3     (loads the model and the KV cache, starts its IO threads; its input DEALERs send
          EngineCoreReadyResponse to every client ROUTER, so that a ROUTER can route to it)
    4     HandshakeReady(ready response)                           READY_TIMEOUT_S (model load)
          or HandshakeFailed(traceback) if start-up raised

While it waits, the launcher also watches each engine's process sentinel: an engine that dies
during start-up is reported at once, with its exit code, not after the timeout.

Engines on other nodes (data_parallel_size_local < data_parallel_size, internal load
balancing): the ROUTER binds tcp://data_parallel_address:data_parallel_rpc_port, the clients'
addresses are tcp ports on that address, and the launcher waits for every rank's HELLO, its
own engines' and those that `minivllm serve --headless -dpl L -dpr S` (or `--nnodes K
--node-rank R`) starts (engine/headless.py; -dpr without -dpl is ignored, as in vLLM):
those have no sentinel here, so the other nodes have HELLO_TIMEOUT_S to come up. The
clients' tcp ports are bound here, before any engine learns them (vLLM binds its listeners
first too: bind_engine_zmq_listeners, vllm/v1/engine/utils.py:1164-1184, and
make_zmq_listener, vllm/utils/network_utils.py:409-439); each client's ZMQ socket adopts
its listening socket (ZMQ_USE_FD), so no other process can take a port in between. Hybrid
and external load balancing (dp_nodes.py): a front end hears only its own node's engines,
ranks start_rank .. start_rank + size_local - 1, over ipc.
In vLLM: vllm/v1/engine/utils.py (wait_for_engine_startup, launch_core_engines,
EngineZmqAddresses, CoreEngineProcManager); the engine's side: EngineCoreProc._perform_handshake
in vllm/v1/engine/core.py.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import socket
import threading
import time
from multiprocessing.context import BaseContext

import msgspec
import zmq

from minivllm.engine.config import EngineConfig
from minivllm.engine.messages import (
    ADDRESSES_TIMEOUT_S, EngineCoreReadyResponse, EngineZmqAddresses, HandshakeFailed,
    HandshakeHello, HandshakeMessage, HandshakeReady)
from minivllm.utils.load_scale import load_scale, why_stretched
from minivllm.utils.mp import ProcHandle, choose_start_method, launch
from minivllm.utils.zmq import (
    IpcDir, close_all, identity_to_rank, make_zmq_socket, tcp_address)

logger = logging.getLogger(__name__)

HELLO_TIMEOUT_S = 120.0  # a spawned engine imports torch first: tens of seconds on a busy host
READY_TIMEOUT_S = 600.0  # loading and dequantizing the model: a minute on 2 busy cores
def _native_threads() -> set[int]:
    """Thread ids of this process that are not Python threads and not ZMQ's I/O threads."""
    try:
        tids = {int(t) for t in os.listdir("/proc/self/task")}
    except OSError:  # not Linux: no way to look
        return set()
    tids -= {t.native_id for t in threading.enumerate()}
    out = set()
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if not f.read().startswith("ZMQbg"):
                    out.add(tid)
        except OSError:
            pass  # it ended meanwhile
    return out


_BASELINE_THREADS = _native_threads()  # numpy's BLAS pool, started at import, survives fork


def start_context() -> BaseContext:
    """utils.mp's choice, except that native threads started since import (torch's OpenMP
    pool, once this process ran a parallel op) force spawn: GNU OpenMP is not fork-safe, and a
    forked engine hangs in its first parallel op (gomp_team_barrier_wait_end)."""
    method, why = choose_start_method()
    new = _native_threads() - _BASELINE_THREADS
    if method == "fork" and new:
        method = "spawn"
        logger.info("engine cores start with spawn: %d native threads (an OpenMP pool?) run "
                    "in this process, and a forked child would deadlock in them", len(new))
    return multiprocessing.get_context(method)


class CoreEngineProcManager:
    """Owns the engine core processes and the private directory of their ipc sockets."""

    def __init__(self, handles: list[ProcHandle], ipc_dir: IpcDir) -> None:
        self.handles = handles
        self.ipc_dir = ipc_dir
        # tcp only: the clients' bound and listening sockets, inputs then outputs
        self.listeners: list[socket.socket] = []
        self.ready_responses: list[EngineCoreReadyResponse] = []
        self._lock = threading.Lock()

    @property
    def sentinels(self) -> list[int]:
        return [h.sentinel for h in self.handles]

    @property
    def pids(self) -> list[int]:
        return [h.pid for h in self.handles]

    def describe_death(self, index: int) -> str:
        handle = self.handles[index]
        return (f"engine core {index} (pid {handle.pid}) died with exit code "
                f"{handle.exit_code(timeout=1.0)}")

    def close(self) -> None:
        """Stop every engine (ask, SIGTERM, SIGKILL) and remove the socket files. Idempotent."""
        with self._lock:
            for handle in self.handles:
                handle.request_stop()  # all at once: DP engines stop in parallel
            for handle in self.handles:
                handle.shutdown()
            self.close_listeners()
            self.ipc_dir.close()

    def client_listeners(self, i: int) -> tuple[socket.socket, socket.socket] | None:
        """Client i's listening input and output sockets (tcp), for it to adopt."""
        if not self.listeners:
            return None
        half = len(self.listeners) // 2
        return self.listeners[i], self.listeners[half + i]

    def close_listeners(self) -> None:
        """This process's copies (a client adopted its own, or a child got a duplicate)."""
        for listener in self.listeners:
            listener.close()


def launch_core_engines(config: EngineConfig, num_api_servers: int = 1,
                        ready_timeout: float = READY_TIMEOUT_S
                        ) -> tuple[CoreEngineProcManager, EngineZmqAddresses]:
    """Start this node's engine cores and wait until all config.data_parallel_size are READY
    (with data_parallel_size_local < data_parallel_size, the others say HELLO over tcp from
    their nodes, `minivllm serve --headless`)."""
    if config.data_parallel_start_rank != 0 and not config.local_engines_only:
        raise ValueError("the front end runs on the node of DP rank 0: data_parallel_start_rank "
                         f"{config.data_parallel_start_rank} belongs to a headless node")
    ipc_dir = IpcDir()
    ctx = zmq.Context()
    handshake = None
    try:
        handshake_address, addresses, listeners = _engine_addresses(config, ipc_dir,
                                                                    num_api_servers)
        handshake = make_zmq_socket(ctx, handshake_address, zmq.ROUTER, bind=True, linger=0)
        manager = start_engine_procs(config, handshake_address, ipc_dir)
        manager.listeners = listeners
        try:
            manager.ready_responses = wait_for_engine_startup(
                handshake, manager, addresses, ready_timeout, config.client_engine_ranks)
        except BaseException:
            manager.close()
            raise
    except BaseException:
        ipc_dir.close()
        raise
    finally:
        close_all(handshake)
        ctx.term()
    return manager, addresses


def _engine_addresses(config: EngineConfig, ipc_dir: IpcDir, num_api_servers: int
                      ) -> tuple[str, EngineZmqAddresses, list[socket.socket]]:
    """ipc:// on one node (and for a front end of its node's engines alone); tcp:// at
    data_parallel_address when engines on other nodes talk to it, each client's port bound
    and listening before it is handed out (vLLM: get_engine_zmq_bind_addresses,
    vllm/v1/engine/utils.py:1120-1161)."""
    if not config.data_parallel_multinode:
        return ipc_dir.path("handshake"), EngineZmqAddresses(
            inputs=[ipc_dir.path(f"input{i}") for i in range(num_api_servers)],
            outputs=[ipc_dir.path(f"output{i}") for i in range(num_api_servers)]), []
    host = config.data_parallel_address
    listeners: list[socket.socket] = []
    try:
        for _ in range(2 * num_api_servers):
            listeners.append(tcp_listener(host))
    except BaseException:
        for listener in listeners:
            listener.close()
        raise
    ports = [listener.getsockname()[1] for listener in listeners]
    return tcp_address(host, config.data_parallel_rpc_port), EngineZmqAddresses(
        inputs=[tcp_address(host, p) for p in ports[:num_api_servers]],
        outputs=[tcp_address(host, p) for p in ports[num_api_servers:]]), listeners


def tcp_listener(host: str) -> socket.socket:
    """A socket bound to a free port on `host` and listening: the port is ours from now on,
    and a client's ZMQ socket takes the socket over (make_zmq_socket's `listener`)."""
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        s.bind((host, 0))
        s.listen()
    except BaseException:
        s.close()
        raise
    return s


def start_engine_procs(config: EngineConfig, handshake_address: str,
                       ipc_dir: IpcDir | None = None) -> CoreEngineProcManager:
    """This node's engine processes, DP ranks start_rank .. start_rank + size_local - 1
    (vLLM: CoreEngineProcManager's start_index/local_start_index). They connect to the
    handshake at `handshake_address`; nobody waits for them here."""
    from minivllm.engine.core_proc import run_engine_core  # the child's module, imported late

    manager = CoreEngineProcManager([], ipc_dir or IpcDir())
    context = start_context()
    first = config.data_parallel_start_rank
    try:
        for rank in range(first, first + config.data_parallel_size_local):
            manager.handles.append(launch(
                run_engine_core, f"EngineCore_{rank}",
                args=(config, rank, handshake_address), context=context))
    except BaseException:
        manager.close()
        raise
    return manager


def wait_for_engine_startup(handshake: zmq.Socket, manager: CoreEngineProcManager,
                            addresses: EngineZmqAddresses, ready_timeout: float, ranks: range
                            ) -> list[EngineCoreReadyResponse]:
    """Answer each engine's HELLO with the addresses; return the ready responses of `ranks`,
    in order. Only this node's engines have sentinels; the others are heard over tcp."""
    decoder = msgspec.msgpack.Decoder(HandshakeMessage)
    reply = msgspec.msgpack.encode(addresses)
    hello: set[int] = set()
    ready: dict[int, EngineCoreReadyResponse] = {}
    poller = zmq.Poller()
    poller.register(handshake, zmq.POLLIN)
    for sentinel in manager.sentinels:
        poller.register(sentinel, zmq.POLLIN)
    start, count, scale = time.monotonic(), len(ranks), load_scale()  # busy: slower starts
    while len(ready) < count:
        waiting_hello = len(hello) < count
        asked = HELLO_TIMEOUT_S if waiting_hello else ready_timeout
        limit = asked * scale
        left = start + limit - time.monotonic()
        events = dict(poller.poll(max(left, 0) * 1000))
        if not events:
            missing = sorted(set(ranks) - (ready.keys() if not waiting_hello else hello))
            what = "said HELLO" if waiting_hello else "reported READY (loading the model)"
            raise TimeoutError(f"engine core(s) {missing} have not {what} within {asked:g} s"
                               f"{why_stretched(asked, limit)}: see their log above, or pass a "
                               "larger ready_timeout")
        for i, sentinel in enumerate(manager.sentinels):
            if sentinel in events:
                raise RuntimeError(f"{manager.describe_death(i)} during start-up, before it "
                                   "reported READY; see its traceback above")
        if handshake in events:
            identity, body = handshake.recv_multipart()
            rank = identity_to_rank(identity)
            if rank not in ranks:
                logger.warning("ignored a HELLO from DP rank %d: this front end waits for "
                               "ranks %s", rank, list(ranks))
                continue
            msg = decoder.decode(body)
            if isinstance(msg, HandshakeHello):
                hello.add(rank)
                handshake.send_multipart([identity, reply])
                if len(hello) == count:
                    start = time.monotonic()  # the READY clock starts once all are running
            elif isinstance(msg, HandshakeFailed):
                raise RuntimeError(f"engine core {rank} failed during start-up:\n{msg.error}")
            else:
                ready[rank] = msg.response
    return [ready[r] for r in ranks]
