"""The two MP clients: SyncMPClient (LLM: an output thread feeds a queue) and AsyncMPClient
(AsyncLLM: an asyncio task feeds an asyncio queue). What they share is MPClient, core_client.py.
In vLLM: vllm/v1/engine/core_client.py (SyncMPClient), AsyncMPClient."""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
import weakref
from concurrent.futures import Future
from typing import Any

import zmq
import zmq.asyncio

from minivllm.engine.config import EngineConfig
from minivllm.engine.core_client import MPClient
from minivllm.engine.exceptions import EngineDeadError
from minivllm.engine.messages import EngineCoreOutputs, EngineCoreRequest
from minivllm.engine.messages import ClientAddresses
from minivllm.utils import tracing

_shutdown_ids = itertools.count()


def settle(future: Future | asyncio.Future, result: Any = None,
           exception: BaseException | None = None) -> None:
    """Complete a utility call's future once: a late reply or a second death is ignored."""
    if future.done():
        return
    if exception is not None:
        future.set_exception(exception)
    else:
        future.set_result(result)


def call_in_loop(loop: asyncio.AbstractEventLoop, fn: Any, *args: Any) -> None:
    """Run fn(*args) on loop, from whichever thread we are on; nothing if the loop is closed."""
    if loop.is_closed():
        return
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        fn(*args)
    else:
        loop.call_soon_threadsafe(fn, *args)


class SyncMPClient(MPClient):
    def __init__(self, config: EngineConfig, client_addresses: ClientAddresses | None = None,
                 client_index: int = 0) -> None:
        self.outputs_queue: queue.Queue[EngineCoreOutputs | BaseException] = queue.Queue()
        super().__init__(config, client_addresses, client_index, zmq.Context())
        self._send_lock = threading.Lock()
        path = f"inproc://minivllm-client-shutdown-{next(_shutdown_ids)}"
        shutdown = self.ctx.socket(zmq.PAIR)
        shutdown.bind(path)
        self.resources.stoppers.append(lambda: _send_nowait(shutdown))
        self.resources.after_threads.append(shutdown)
        self.start_thread(_process_outputs_socket, "EngineCoreOutputQueueThread", path)

    def _wake_waiters(self, error: EngineDeadError) -> None:
        self.outputs_queue.put(error)

    def _set_future(self, future: Future, result: Any = None,
                    exception: BaseException | None = None) -> None:
        settle(future, result, exception)

    def get_output(self) -> EngineCoreOutputs:
        item = self.outputs_queue.get()
        if isinstance(item, BaseException):
            self.outputs_queue.put(item)  # for the next caller: nobody waits forever
            raise item
        with self._send_lock:
            self._record_finished(item)
        return item

    def add_request(self, request: EngineCoreRequest) -> None:
        with self._send_lock:
            self.input_socket.send_multipart(self._add_frames(request), copy=False)

    def abort_requests(self, request_ids: list[str]) -> None:
        with self._send_lock:
            for frames in self._abort_frames(request_ids):
                self.input_socket.send_multipart(frames, copy=False)

    def call_utility(self, method: str, *args: Any, engine: int = 0) -> Any:
        return self._call(method, args, [engine])[0]

    def call_utility_all(self, method: str, *args: Any) -> list:
        """Call `method` on every DP engine; their results in rank order."""
        return self._call(method, args, range(len(self.core_engines)))

    def _call(self, method: str, args: tuple, ranks: Any) -> list:
        futures = []
        with self._send_lock:
            for rank in ranks:
                futures.append(Future())
                self.input_socket.send_multipart(
                    self._utility_frames(rank, method, args, futures[-1]), copy=False)
        return [f.result() for f in futures]

    def shutdown(self) -> None:
        """Stop the engines and close everything; idempotent."""
        if self._begin_shutdown():
            self._finalizer()


def _send_nowait(sock: zmq.Socket) -> None:
    try:  # the thread may be gone already (it leaves on ENGINE_CORE_DEAD): never block
        sock.send(b"", zmq.NOBLOCK)
    except zmq.Again:
        pass


def _process_outputs_socket(client_ref: "weakref.ref[SyncMPClient]", shutdown_path: str) -> None:
    """SyncMPClient's output thread: outputs into the queue, utility replies to their futures.
    It holds the client only while it handles a message, so a dropped client is collected."""
    client = client_ref()
    ctx, output_socket = client.ctx, client.output_socket
    shutdown = ctx.socket(zmq.PAIR)
    shutdown.connect(shutdown_path)
    poller = zmq.Poller()
    poller.register(shutdown, zmq.POLLIN)
    poller.register(output_socket, zmq.POLLIN)
    del client
    try:
        while shutdown not in dict(poller.poll()):
            frames = output_socket.recv_multipart(copy=False)
            if (client := client_ref()) is None:
                break
            try:
                outputs = client._decode_output(frames)
                if outputs is not None:
                    client.outputs_queue.put(outputs)
            except EngineDeadError as e:
                client.set_dead(e)
                break
            except Exception as e:  # noqa: BLE001 - the thread must report, not vanish
                client.set_dead(EngineDeadError(f"the client's output thread failed: {e!r}"))
                break
            del client
    finally:
        shutdown.close(linger=0)


class AsyncMPClient(MPClient):
    def __init__(self, config: EngineConfig, client_addresses: ClientAddresses | None = None,
                 client_index: int = 0) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.outputs_queue: asyncio.Queue | None = None
        self.output_task: asyncio.Task | None = None
        super().__init__(config, client_addresses, client_index, zmq.asyncio.Context())

    def _ensure_output_task(self) -> None:
        """Start reading outputs on the running loop, at the first call made from it."""
        if self.output_task is not None:
            return
        self.outputs_queue = asyncio.Queue()
        self.loop = asyncio.get_running_loop()
        if self.dead_error is not None:
            self.outputs_queue.put_nowait(self.dead_error)
        self.output_task = self.loop.create_task(self._process_outputs_socket())

    async def _process_outputs_socket(self) -> None:
        try:
            while True:
                outputs = self._decode_output(
                    await self.output_socket.recv_multipart(copy=False))
                if outputs is not None:
                    self.outputs_queue.put_nowait(outputs)
        except EngineDeadError as e:
            self.set_dead(e)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001
            self.set_dead(EngineDeadError(f"the client's output task failed: {e!r}"))

    def _in_loop(self, fn: Any, *args: Any) -> None:
        if self.loop is not None:
            call_in_loop(self.loop, fn, *args)

    def _wake_waiters(self, error: EngineDeadError) -> None:
        if self.outputs_queue is not None:
            self._in_loop(self.outputs_queue.put_nowait, error)

    def _set_future(self, future: asyncio.Future, result: Any = None,
                    exception: BaseException | None = None) -> None:
        self._in_loop(settle, future, result, exception)

    async def get_output_async(self) -> EngineCoreOutputs:
        self._ensure_output_task()
        item = await self.outputs_queue.get()
        if isinstance(item, BaseException):
            self.outputs_queue.put_nowait(item)
            raise item
        self._record_finished(item)
        return item

    async def add_request_async(self, request: EngineCoreRequest) -> None:
        self._ensure_output_task()
        with tracing.span("send"):
            frames = self._add_frames(request)
        await self.input_socket.send_multipart(frames, copy=False)

    async def abort_requests_async(self, request_ids: list[str]) -> None:
        self._ensure_output_task()
        for frames in self._abort_frames(request_ids):
            await self.input_socket.send_multipart(frames, copy=False)

    async def call_utility_async(self, method: str, *args: Any, engine: int = 0) -> Any:
        return (await self._call(method, args, [engine]))[0]

    async def call_utility_all_async(self, method: str, *args: Any) -> list:
        return await self._call(method, args, range(len(self.core_engines)))

    async def _call(self, method: str, args: tuple, ranks: Any) -> list:
        self._ensure_output_task()
        futures = []
        for rank in ranks:
            futures.append(self.loop.create_future())
            await self.input_socket.send_multipart(
                self._utility_frames(rank, method, args, futures[-1]), copy=False)
        return list(await asyncio.gather(*futures))

    def shutdown(self) -> None:
        """Stop the engines and close everything; idempotent, callable from any thread."""
        if not self._begin_shutdown():
            return
        task = self.output_task
        if task is not None and not task.done():
            self._in_loop(task.cancel)
        self._finalizer()
