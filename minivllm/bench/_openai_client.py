"""The load generator of `minivllm bench serve`: streaming completions from any OpenAI-compatible
server (minivllm serve, vLLM, llama.cpp's llama-server), timed token by token.

A minimal asyncio HTTP/1.1 client: one connection per request, the SSE body parsed by hand, chunked
or not. It is several times cheaper per token than httpx or the openai client, which matters when
the load generator shares the CPU with the server it measures.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field

import msgspec

from minivllm.utils.progress import tqdm

MODELS_TIMEOUT_S = 10.0  # GET /v1/models: a live server answers at once


@dataclass
class RequestResult:
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    e2e: float = 0.0
    output_tokens: int = 0
    error: str | None = None

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first, as vLLM's benchmark defines it."""
        if self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)


@dataclass(frozen=True)
class Endpoint:
    """Where the requests go: vLLM's --base-url (or --host/--port) plus --endpoint."""

    host: str
    port: int
    path: str = "/v1/completions"
    model: str | None = None  # the "model" field of every request; None leaves it out
    api_key: str | None = None

    @classmethod
    def from_url(cls, base_url: str, path: str = "/v1/completions",
                 api_key: str | None = None) -> "Endpoint":
        url = urllib.parse.urlsplit(base_url)
        if url.scheme != "http" or not url.hostname:
            raise ValueError(f"--base-url must look like http://HOST:PORT, got {base_url!r} "
                             f"(this client speaks plain HTTP only)")
        prefix = url.path.rstrip("/")
        return cls(url.hostname, url.port or 80, prefix + path,
                   api_key=api_key or os.environ.get("OPENAI_API_KEY"))

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def request_head(self, body_len: int) -> bytes:
        auth = f"Authorization: Bearer {self.api_key}\r\n" if self.api_key else ""
        return (f"POST {self.path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n{auth}"
                f"Content-Type: application/json\r\nContent-Length: {body_len}\r\n"
                f"Connection: close\r\n\r\n").encode()


def first_model(endpoint: Endpoint) -> str | None:
    """The first id /v1/models lists, as vLLM's benchmark picks its --model; None if there is
    no such route (the request then carries no model name)."""
    prefix = endpoint.path.rsplit("/v1/", 1)[0]
    req = urllib.request.Request(f"{endpoint.base_url}{prefix}/v1/models")
    if endpoint.api_key:
        req.add_header("Authorization", f"Bearer {endpoint.api_key}")
    try:
        with urllib.request.urlopen(req, timeout=MODELS_TIMEOUT_S) as r:
            models = json.load(r).get("data") or []
    except urllib.error.HTTPError:
        return None
    except OSError as e:
        raise ConnectionError(f"no OpenAI-compatible server answers at {endpoint.base_url} "
                              f"({e}); start it, or fix --base-url") from None
    return models[0]["id"] if models else None


async def _body_chunks(reader: asyncio.StreamReader, chunked: bool):
    """The response body as it arrives: HTTP/1.1 chunks, or reads until the server closes."""
    while True:
        if chunked:
            size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
            if size == 0:
                return
            yield (await reader.readexactly(size + 2))[:-2]
        else:
            data = await reader.read(1 << 16)
            if not data:
                return
            yield data


async def _sse_events(reader: asyncio.StreamReader, chunked: bool):
    """Yield the `data:` payloads of an SSE body, as bytes."""
    buf = b""
    async for chunk in _body_chunks(reader, chunked):
        buf += chunk.replace(b"\r\n", b"\n")
        *events, buf = buf.split(b"\n\n")
        for event in events:
            if event.startswith(b"data:"):
                yield event[5:].strip()
            elif event.startswith(b"error:"):  # llama-server's way of failing a stream
                yield b'{"error": {"message": %s}}' % json.dumps(event[6:].decode()).encode()


async def _read_head(reader: asyncio.StreamReader) -> tuple[bytes, bool]:
    """The status line and whether the body is chunked."""
    status, chunked = await reader.readline(), False
    while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"transfer-encoding" and b"chunked" in value.lower():
            chunked = True
    return status, chunked


async def stream_completion(endpoint: Endpoint, body: bytes) -> RequestResult:
    """POST one streaming completion; time each event that carries text."""
    result = RequestResult()
    start = last = time.perf_counter()
    reader, writer = await asyncio.open_connection(endpoint.host, endpoint.port)
    try:
        writer.write(endpoint.request_head(len(body)) + body)
        status, chunked = await _read_head(reader)
        if b" 200 " not in status:
            result.error = status.decode().strip() or "the server closed the connection"
            return result
        events = 0
        async for data in _sse_events(reader, chunked):
            if data == b"[DONE]":
                break
            event = msgspec.json.decode(data)
            if "error" in event:
                result.error = event["error"]["message"]
                break
            now = time.perf_counter()
            if event.get("choices") and event["choices"][0].get("text"):
                events += 1
                if result.ttft == 0.0:
                    result.ttft = now - start
                else:
                    result.itl.append(now - last)
                last = now
            if event.get("usage"):
                result.output_tokens = event["usage"]["completion_tokens"]
        result.output_tokens = result.output_tokens or events  # no usage: one token an event
        result.e2e = time.perf_counter() - start
    finally:
        writer.close()
    return result


def completion_body(prompt: list[int], output_len: int, model: str | None) -> bytes:
    """A greedy streaming request for exactly output_len tokens (ignore_eos, as vLLM's bench)."""
    body = {"prompt": prompt, "max_tokens": output_len, "temperature": 0.0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    if model is not None:
        body["model"] = model
    return msgspec.json.encode(body)


async def run_load(endpoint: Endpoint, prompts: list[list[int]], output_len: int,
                   concurrency: int, desc: str) -> tuple[list[RequestResult], float]:
    """Closed loop: `concurrency` requests in flight until every prompt is served."""
    semaphore = asyncio.Semaphore(concurrency)
    bar = tqdm(total=len(prompts), desc=desc, unit="req", leave=False)

    async def one(prompt: list[int]) -> RequestResult:
        body = completion_body(prompt, output_len, endpoint.model)
        async with semaphore:
            try:
                result = await stream_completion(endpoint, body)
            except (OSError, asyncio.IncompleteReadError, msgspec.DecodeError) as e:
                result = RequestResult(error=f"{type(e).__name__}: {e}")
        bar.update(1)
        return result
    start = time.perf_counter()
    results = await asyncio.gather(*(one(p) for p in prompts))
    wall = time.perf_counter() - start
    bar.close()
    return list(results), wall
