"""The OpenAI-compatible HTTP server: FastAPI routes on uvicorn, in front of an AsyncLLM.

Routes: POST /v1/chat/completions and /v1/completions (whole or streamed as server-sent events),
GET /v1/models, /health (200, or 503 once the engine is dead), /metrics (Prometheus text).

Three behaviours come from vLLM:
- The body is parsed here, not by FastAPI, so malformed JSON and bad fields are 400 with OpenAI's
  error body, never FastAPI's 422 (vLLM maps RequestValidationError to 400 in
  vllm/entrypoints/serve/exception_handling/handlers/validation.py (validation_exception_handler)).
- A client that disconnects cancels its handler, and the cancellation closes the request's
  generator, which aborts it in the engine and frees its KV blocks: `with_cancellation`,
  vllm/entrypoints/serve/utils/api_utils.py (listen_for_disconnect), for whole responses; for streams, Starlette's
  StreamingResponse listens for the disconnect itself and cancels the stream.
- When the engine dies, /health answers 503 and a watchdog makes uvicorn exit (vLLM's
  watchdog_loop and terminate_if_errored, vllm/entrypoints/launchers/launcher.py (watchdog_loop));
  streams in flight end with an error event.

A body is read up to 32 MiB (MINIVLLM_MAX_BODY_BYTES) and refused with 413 beyond it (vLLM
sets no limit; a server that holds whatever it is sent can be made to hold gigabytes). The body
is parsed and tokenized on a worker thread, so the event loop keeps streaming meanwhile.
uvicorn, the watchdog and the clean stop are in http_server.py; the limits on a request's head
and on idle connections in http_limits.py.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import hashlib
import os
import secrets
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from http import HTTPStatus
from typing import Any, Awaitable, Callable

import msgspec
import pydantic
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from minivllm.entrypoints.openai.metrics import ServerMetrics
from minivllm.entrypoints.openai.protocol import (ChatCompletionRequest, CompletionRequest,
                                                  ModelCard, ModelList, to_json)
from minivllm.entrypoints.openai.serving_chat import OpenAIServingChat
from minivllm.entrypoints.openai.serving_completion import OpenAIServingCompletion
from minivllm.entrypoints.openai.http_server import stop_error
from minivllm.entrypoints.openai.serving_engine import OpenAIError, validation_error
from minivllm.utils import tracing
from minivllm.utils.byte_sizes import parse_bytes

JSON = "application/json"
# The largest body accepted: far above any prompt the context can hold (a few hundred kB of
# text at 8k tokens), small enough that a flood of such bodies cannot exhaust memory.
# MINIVLLM_MAX_BODY_BYTES (a size such as 64M) sets another.
MAX_BODY_ENV = "MINIVLLM_MAX_BODY_BYTES"
MAX_BODY_BYTES = 32 << 20
BODY_TIMEOUT_ENV = "MINIVLLM_HTTP_BODY_TIMEOUT_S"
BODY_IDLE_TIMEOUT_S = 30.0  # a body that stops arriving this long: 408 (or BODY_TIMEOUT_ENV)


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (malloc.h)
MMAP_THRESHOLD_BYTES = 1 << 20


def return_big_buffers_to_the_os() -> None:
    """Serve every allocation of 1 MiB or more from its own mmap, unmapped when freed. By
    default glibc raises that threshold to the size of the last big block freed (up to 32 MiB),
    so after one 20 MB body the next ones live in the heap, and the process keeps the memory."""
    if (name := ctypes.util.find_library("c")) is not None:
        try:
            ctypes.CDLL(name).mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
        except (OSError, AttributeError):  # not glibc: its own policy stays
            pass


def max_body_bytes() -> int:
    value = os.environ.get(MAX_BODY_ENV)
    return parse_bytes(value) if value else MAX_BODY_BYTES


def body_idle_timeout_s() -> float:
    try:
        return float(os.environ.get(BODY_TIMEOUT_ENV, BODY_IDLE_TIMEOUT_S))
    except ValueError:
        return BODY_IDLE_TIMEOUT_S


async def read_body(raw: Request, limit: int, idle_timeout: float) -> bytes:
    """The body, or 413 as soon as it is known to exceed `limit` (by its Content-Length, or
    while it arrives); 408 if it stops arriving for `idle_timeout` seconds."""
    declared = raw.headers.get("content-length", "")
    size = int(declared) if declared.isdigit() else 0
    chunks: list[bytes] = []
    if size <= limit:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(idle_timeout) as deadline:  # one timer, moved on
                async for chunk in raw.stream():
                    deadline.reschedule(loop.time() + idle_timeout)
                    size += len(chunk) * (not declared.isdigit())
                    if size > limit:
                        break
                    chunks.append(chunk)
        except TimeoutError:
            raise OpenAIError(f"the request body stopped arriving for {idle_timeout:g} s",
                              HTTPStatus.REQUEST_TIMEOUT, "RequestTimeoutError") from None
    if size > limit:
        raise OpenAIError(f"the request body is {'at least ' * (not declared.isdigit())}"
                          f"{size} bytes, more than this server's limit of {limit} "
                          f"bytes ({MAX_BODY_ENV}); send a shorter prompt or split the batch",
                          HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "RequestEntityTooLargeError")
    return b"".join(chunks)


def error_response(exc: BaseException) -> Response:
    err = OpenAIError.from_exception(exc)
    return Response(err.body(), status_code=int(err.status), media_type=JSON)


async def listen_for_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def with_cancellation(work: Awaitable[Any], request: Request) -> tuple[bool, Any]:
    """Run `work` until it finishes or the client disconnects, whichever comes first; a
    disconnect cancels it. Call only once the body is read: this consumes the request's
    messages. Returns (finished, result)."""
    handler = asyncio.ensure_future(work)
    listener = asyncio.ensure_future(listen_for_disconnect(request))
    done, pending = await asyncio.wait([handler, listener], return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    if handler in done:
        return True, handler.result()
    return False, None


class ApiKeyMiddleware:
    """401 on /v1 without `Authorization: Bearer <key>`, checked as vLLM's
    AuthenticationMiddleware does (vllm/entrypoints/serve/middleware/authenticate.py:28-62):
    the scheme in any case, the first Authorization header, the key's SHA-256 compared in
    constant time (secrets.compare_digest), OPTIONS (a CORS preflight) let through. vLLM answers
    {"error": "Unauthorized"}; here the body is OpenAI's error object, which the openai client
    reads."""

    def __init__(self, app: Callable, api_key: str) -> None:
        self.app, self.expected = app, hashlib.sha256(api_key.encode()).digest()

    def authorized(self, headers: list[tuple[bytes, bytes]]) -> bool:
        value = next((v for k, v in headers if k == b"authorization"), b"")
        scheme, _, key = value.partition(b" ")
        digest = hashlib.sha256(key).digest()
        return secrets.compare_digest(digest, self.expected) and scheme.lower() == b"bearer"

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if (scope["type"] == "http" and scope.get("method") != "OPTIONS"
                and scope["path"].startswith("/v1") and not self.authorized(scope["headers"])):
            err = OpenAIError("Invalid or missing API key: send `Authorization: Bearer <key>`",
                              HTTPStatus.UNAUTHORIZED, "AuthenticationError")
            await Response(err.body(), 401, media_type=JSON)(scope, receive, send)
            return
        await self.app(scope, receive, send)


def check_json_media_type(raw: Request) -> None:
    """vLLM's validate_json_request (vllm/entrypoints/serve/utils/api_utils.py (validate_json_request)): a body
    that does not say it is JSON is refused, whatever it holds."""
    media_type = raw.headers.get("content-type", "").lower().split(";", 1)[0].strip()
    if media_type != JSON:
        raise OpenAIError(f"Unsupported Media Type: Only 'application/json' is allowed (this "
                          f"body is {media_type or 'untyped'}); send Content-Type: {JSON}")


async def http_error(raw: Request, exc: HTTPException) -> Response:
    """404 and 405 in OpenAI's error shape, typed by the status's phrase as vLLM does
    (vllm/entrypoints/serve/exception_handling/handlers/http.py (http_exception_handler))."""
    status = HTTPStatus(exc.status_code)
    err = OpenAIError(f"{exc.detail}: {raw.method} {raw.url.path}; this server serves POST "
                      f"/v1/chat/completions and /v1/completions, GET /v1/models, /health and "
                      f"/metrics", status, status.phrase)
    return Response(err.body(), status_code=int(status), media_type=JSON,
                    headers=getattr(exc, "headers", None))


def parse_body(model: type[pydantic.BaseModel], body: bytes) -> pydantic.BaseModel:
    """The request model from the body. msgspec reads the JSON (3x faster than pydantic's
    reader for a body of token ids, and the parsing thread holds the GIL the event loop needs
    meanwhile); what msgspec refuses (NaN, 1e999) goes to pydantic, whose errors name the
    field."""
    with tracing.span("http_parse"):
        try:
            data = msgspec.json.decode(body)
        except msgspec.DecodeError:
            return model.model_validate_json(body)
        return model.model_validate(data)


def build_app(engine: Any, served_model_names: list[str], api_key: str | None = None) -> FastAPI:
    return_big_buffers_to_the_os()
    metrics = ServerMetrics(served_model_names[0])
    # one thread, as vLLM's renderer has (vllm/renderers/base.py (_SwappableExecutor.__init__)): requests queue for it
    executor = ThreadPoolExecutor(1, thread_name_prefix="tokenize")
    chat = OpenAIServingChat(engine, served_model_names, metrics, executor)
    completion = OpenAIServingCompletion(engine, served_model_names, metrics, executor)
    app = FastAPI(title="minivllm", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.engine, app.state.metrics, app.state.stopping = engine, metrics, False
    chat.app_state = completion.app_state = app.state  # they refuse new work once stopping
    body_limit, body_timeout = max_body_bytes(), body_idle_timeout_s()
    app.add_exception_handler(HTTPException, http_error)

    async def openai_endpoint(raw: Request, model: type[pydantic.BaseModel],
                              create: Callable[[Any], Awaitable[Any]]) -> Response:
        try:
            if app.state.stopping:
                raise stop_error()
            check_json_media_type(raw)
            body = await read_body(raw, body_limit, body_timeout)
            request = await chat.run_sync(parse_body, model, body)
            del body  # a huge prompt's bytes are not kept while it runs
            finished, result = await with_cancellation(create(request), raw)
        except ClientDisconnect:  # left during the upload: nothing ran, nobody to answer
            print(f"minivllm serve: a client disconnected while sending its body to "
                  f"{raw.url.path}; request dropped", file=sys.stderr, flush=True)
            return Response(status_code=499)
        except Exception as e:  # noqa: BLE001 - every failure becomes OpenAI's error body
            # The traceback's frames hold the request (a 20 MB prompt, say) in a cycle
            # through the failed task: drop them now rather than at the next full GC.
            e.__traceback__ = None
            return error_response(validation_error(e) if isinstance(
                e, pydantic.ValidationError) else e)
        if not finished:  # the client is gone; nobody reads this
            return Response(status_code=499)
        if hasattr(result, "__anext__"):
            return StreamingResponse(result, media_type="text/event-stream")
        return Response(to_json(result), media_type=JSON)

    @app.post("/v1/chat/completions")
    async def create_chat_completion(raw_request: Request) -> Response:
        return await openai_endpoint(raw_request, ChatCompletionRequest,
                                     chat.create_chat_completion)

    @app.post("/v1/completions")
    async def create_completion(raw_request: Request) -> Response:
        return await openai_endpoint(raw_request, CompletionRequest, completion.create_completion)

    @app.get("/v1/models")
    async def show_models() -> Response:
        cards = [ModelCard(name, int(time.time()), chat.max_model_len, root=engine.config.model)
                 for name in served_model_names]
        return Response(to_json(ModelList(cards)), media_type=JSON)

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=503 if engine.errored else 200)

    @app.get("/metrics")
    async def show_metrics() -> Response:
        if not engine.errored:
            try:
                metrics.update_engine_stats(await engine.get_stats())
            except Exception as e:  # noqa: BLE001 - the gauges keep their last values
                print(f"minivllm serve: /metrics could not read the engine's stats: {e!r}",
                      file=sys.stderr, flush=True)
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    if api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=api_key)
    return app
