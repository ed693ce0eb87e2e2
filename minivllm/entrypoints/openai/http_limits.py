"""Limits on what a client can make the HTTP server hold: uvicorn's httptools protocol with a
cap on a request's head, a deadline for sending it, and a cap on open connections.

uvicorn's own limits (h11_max_incomplete_event_size, h11_max_header_count) apply only to its
h11 protocol; minivllm serves with httptools (several times faster per chunk), which buffers a
header line of any size and keeps a connection that never sends a byte. So this subclass:

- answers 431 once a request's head (request line and headers) passes MAX_HEAD_BYTES or
  MAX_HEADERS headers: vLLM's limits for h11 (4 MiB and 256,
  vllm/entrypoints/launchers/utils/constants.py:6-7, applied in
  vllm/entrypoints/launchers/launcher.py:211-226);
- answers 408 and closes a connection whose request head is not complete 20 s
  (MINIVLLM_HTTP_HEAD_TIMEOUT_S) after its first byte, or after the connection opened: a
  silent or trickling client cannot hold a file descriptor for long;
- raises the open-file limit as vLLM's set_ulimit does (vllm/utils/system_utils.py:264-284),
  and past it less a reserve, closes each new connection at once (503), so that a flood of
  idle connections cannot take the descriptors the server needs to serve the others.

uvicorn's timeout_keep_alive (serve_http sets vLLM's 5 s, VLLM_HTTP_TIMEOUT_KEEP_ALIVE in
vllm/envs.py) closes an idle connection between requests.
"""

from __future__ import annotations

import asyncio
import os
import resource
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from minivllm.entrypoints.openai.errors import OpenAIError

MAX_HEAD_BYTES = 4 << 20
MAX_HEADERS = 256
HEAD_TIMEOUT_ENV = "MINIVLLM_HTTP_HEAD_TIMEOUT_S"
DEFAULT_HEAD_TIMEOUT_S = 20.0
FD_RESERVE = 256  # descriptors kept for the engine's sockets, files and /health
WANTED_FDS = 65535  # vLLM's set_ulimit target (vllm/utils/system_utils.py:264-284)


def raise_fd_limit() -> int:
    """The soft limit on open files raised toward the hard one, as vLLM's set_ulimit does;
    returns the limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = WANTED_FDS if hard == resource.RLIM_INFINITY else min(WANTED_FDS, hard)
    if soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError):
            pass
    return soft


def head_timeout_s() -> float:
    try:
        return float(os.environ.get(HEAD_TIMEOUT_ENV, DEFAULT_HEAD_TIMEOUT_S))
    except ValueError:
        return DEFAULT_HEAD_TIMEOUT_S


def error_bytes(status: int, phrase: str, message: str) -> bytes:
    body = OpenAIError(message, status, phrase).body()
    return (f"HTTP/1.1 {status} {phrase}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode() + body


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    max_connections = 1024  # configure() sets it from the file descriptor limit
    head_timeout_s = DEFAULT_HEAD_TIMEOUT_S

    @classmethod
    def configure(cls) -> type["LimitedHttpToolsProtocol"]:
        """Raise this process's descriptor limit and size the caps from it and the env."""
        cls.max_connections = max(64, raise_fd_limit() - FD_RESERVE)
        cls.head_timeout_s = head_timeout_s()
        return cls

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.head_bytes = 0
        self.num_headers = 0
        self.in_head = True  # between requests, the next byte starts a head
        self.refused = False
        self.head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: Any) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            self.refuse(503, "Service Unavailable", f"this server holds "
                        f"{self.max_connections} connections already; retry shortly")
            return
        self.arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self.cancel_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.refused:
            return
        if self.in_head:
            self.head_bytes += len(data)
            if self.head_bytes > MAX_HEAD_BYTES:
                self.refuse(431, "Request Header Fields Too Large",
                            f"the request's line and headers pass {MAX_HEAD_BYTES} bytes")
                return
        super().data_received(data)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.num_headers = 0
        if self.head_timer is None:
            self.arm_head_timer()

    def on_header(self, name: bytes, value: bytes) -> None:
        self.num_headers += 1
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self.cancel_head_timer()
        self.in_head, self.head_bytes = False, 0
        if self.num_headers > MAX_HEADERS:
            self.refuse(431, "Request Header Fields Too Large",
                        f"the request has {self.num_headers} headers, more than {MAX_HEADERS}")
            return
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if not self.refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self.refused:
            return
        self.in_head = True
        super().on_message_complete()

    def arm_head_timer(self) -> None:
        self.cancel_head_timer()
        self.head_timer = self.loop.call_later(self.head_timeout_s, self.head_timed_out)

    def cancel_head_timer(self) -> None:
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None

    def head_timed_out(self) -> None:
        self.head_timer = None
        if self.in_head and not self.transport.is_closing():
            self.refuse(408, "Request Timeout",
                        f"the request's headers did not arrive within {self.head_timeout_s:g} s")

    def refuse(self, status: int, phrase: str, message: str) -> None:
        """Answer with OpenAI's error body and close: nothing more is read."""
        self.refused = True
        self.cancel_head_timer()
        if not self.transport.is_closing():
            self.transport.write(error_bytes(status, phrase, message))
            self.transport.close()
