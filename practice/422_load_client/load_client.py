"""Exercise 422 (see README.md): a load client that measures TTFT and ITL correctly.

TTFT is from sending the request to the first event that carries text (not to the response
headers, not to an empty first event such as a chat role delta). ITL is the gap between one
token and the next, one per pair of consecutive tokens: n tokens give n - 1 gaps, the first
token's wait is TTFT's, not an ITL. Gaps are kept per token, not per read(): one read may
bring several events, and one event may come in several reads, so the parser buffers bytes
until a blank line ends an event. Percentiles are over every gap of every request, as vLLM's
benchmark does (vllm/benchmarks/serve.py:602 calculate_metrics, :661; its streaming client,
vllm/benchmarks/lib/endpoint_request_func.py:207, skips chat events without streamed output,
:470, as we skip events with empty text).
"""

from __future__ import annotations

import http.client
import json
import time
from dataclasses import dataclass, field
from typing import Callable

DONE = "[DONE]"
READ_BYTES = 65536


@dataclass
class RequestResult:
    ok: bool = False
    ttft: float | None = None  # s from sending to the first event with text
    itls: list[float] = field(default_factory=list)  # s between consecutive tokens
    e2e: float | None = None  # s from sending to the last token: ttft + sum(itls)
    n_tokens: int = 0
    text: str = ""
    error: str = ""


class SSEParser:
    """Bytes in, the data of each complete event out, in order."""

    def __init__(self):
        raise NotImplementedError("TODO: a buffer for the bytes of an unfinished event")

    def feed(self, data: bytes) -> list[str]:
        raise NotImplementedError("TODO: split complete events at a blank line; keep 'data:' "
                                  "lines (one optional space after the colon); \\r\\n too")


def stream_request(host: str, port: int, prompt: str, max_tokens: int,
                   clock: Callable[[], float] = time.perf_counter,
                   timeout: float = 30.0) -> RequestResult:
    """POST one streaming completion and time it; errors end up in the result, not raised."""
    raise NotImplementedError("TODO: http.client; the clock before sending; a timestamp per "
                              "event with text")


def run_load(host: str, port: int, prompts: list[str], max_tokens: int,
             concurrency: int) -> list[RequestResult]:
    """Every prompt once, at most `concurrency` in flight; results in prompt order."""
    raise NotImplementedError("TODO: a thread pool of `concurrency` workers")


def percentile(values: list[float], p: float) -> float:
    """Linear interpolation between closest ranks (numpy.percentile's default)."""
    raise NotImplementedError("TODO")


def summarize(results: list[RequestResult], duration_s: float) -> dict:
    """Over the successful requests: TTFT, ITL (every gap of every request) and E2E
    percentiles, and output tokens per second of the run."""
    raise NotImplementedError("TODO")
