"""uvicorn around the app: the listening socket, the engine watchdog, and a clean stop.

A stop (SIGINT/SIGTERM, or the launcher stopping this API server at -dp > 1) goes as vLLM's
default "abort" shutdown (shutdown_timeout 0, vllm/entrypoints/launchers/launcher.py:262-286):
requests in flight are ended at once rather than waited for. Here each still gets an OpenAI
answer: a whole response a 503 with the error body, a stream an error event and `data: [DONE]`
(both written by the handlers, which see the error their engine generator raises). New
connections are refused at once: the listening socket is shut down, so a client's connect
fails instead of waiting in the backlog of a server that will never accept it. One line is
logged for the stop, not one per request.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import sys
from http import HTTPStatus
from typing import Any, Callable, Iterator

import uvicorn
from fastapi import FastAPI

from minivllm.entrypoints.openai.errors import OpenAIError
from minivllm.entrypoints.openai.http_limits import LimitedHttpToolsProtocol

WATCHDOG_INTERVAL_S = 0.5  # how often the server checks that the engine is alive (vLLM: 5 s)
DEATH_GRACE_S = 1.0  # after the engine dies: /health says 503, streams get their error event
GRACEFUL_SHUTDOWN_S = 3  # open connections get this long to finish once the server exits
KEEP_ALIVE_S = 5  # an idle connection between requests: vLLM's VLLM_HTTP_TIMEOUT_KEEP_ALIVE


class NoSignalServer(uvicorn.Server):
    """uvicorn without its own signal handlers: after serving it re-raises a captured SIGTERM,
    which would kill the process before the engine is shut down. serve_http installs its own
    (vLLM does the same: vllm/entrypoints/launchers/launcher.py (NoSignalServer))."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def create_server_socket(host: str, port: int) -> socket.socket:
    """Bind before the engine starts, so a busy port fails in a second, not after loading."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port}: {e.strerror}; choose another --port "
                      f"or stop what holds it (`ss -ltnp | grep :{port}`)") from e
    sock.set_inheritable(True)
    return sock


async def watch_engine(server: uvicorn.Server, engine: Any) -> None:
    while not engine.errored:
        await asyncio.sleep(WATCHDOG_INTERVAL_S)
    print(f"minivllm serve: the engine died; the API server exits in {DEATH_GRACE_S:g} s",
          flush=True)
    await asyncio.sleep(DEATH_GRACE_S)
    server.should_exit = True


def stop_error() -> OpenAIError:
    return OpenAIError("the server is shutting down: this request was stopped before it "
                       "finished; send it again (to another server, or once this one is back)",
                       HTTPStatus.SERVICE_UNAVAILABLE, "ServiceUnavailableError")


def begin_stop(app: FastAPI, server: uvicorn.Server, sock: socket.socket, why: str) -> None:
    """Refuse new connections, end every request in flight with an OpenAI error, and let
    uvicorn exit once their answers are written. Idempotent."""
    if app.state.stopping:
        return
    app.state.stopping = True
    engine = app.state.engine
    collectors = list(getattr(engine, "collectors", {}).values())
    print(f"minivllm serve: {why}: stopping; {len(collectors)} request(s) in flight end with "
          f"an error, new connections are refused", file=sys.stderr, flush=True)
    with contextlib.suppress(OSError):  # the kernel refuses connects from now on
        sock.shutdown(socket.SHUT_RDWR)
    for uv_server in getattr(server, "servers", []):
        uv_server.close()  # this process accepts no more
    for collector in collectors:  # each generator raises it; the handlers answer with it
        collector.put(stop_error())
    server.should_exit = True


async def serve_http(app: FastAPI, sock: socket.socket, engine: Any,
                     on_started: Callable[[], None] | None = None) -> int:
    """Serve on `sock` until SIGINT/SIGTERM or the engine's death; returns the exit code.
    `on_started` runs once uvicorn accepts connections."""
    config = uvicorn.Config(app, http=LimitedHttpToolsProtocol.configure(), log_level="warning",
                            access_log=False, timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
                            timeout_keep_alive=KEEP_ALIVE_S, lifespan="off")
    server = NoSignalServer(config)
    app.state.stopping = False
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, begin_stop, app, server, sock,
                                f"{signal.Signals(sig).name} received")
    watchdog = asyncio.create_task(watch_engine(server, engine))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not (server.started or serving.done()):
            await asyncio.sleep(0.01)
        if server.started and on_started is not None:
            on_started()
        await serving
    finally:
        watchdog.cancel()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    return 1 if engine.errored else 0
