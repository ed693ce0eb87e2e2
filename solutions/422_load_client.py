"""Exercise 422, reference answer: a load client that measures TTFT and ITL correctly.

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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

DONE = "[DONE]"
READ_BYTES = 65536  # given by the starter as it is  # pragma: no mutate


@dataclass
class RequestResult:  # pragma: no mutate block
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
        self._buf = b""

    def feed(self, data: bytes) -> list[str]:
        self._buf = (self._buf + data).replace(b"\r\n", b"\n")  # a pair may span feeds
        events = []
        while b"\n\n" in self._buf:
            raw, self._buf = self._buf.split(b"\n\n", 1)
            lines = [line[5:] for line in raw.decode("utf-8").split("\n")
                     if line.startswith("data:")]  # ":..." lines are comments
            if lines:
                events.append("\n".join(x[1:] if x.startswith(" ") else x for x in lines))
        return events


def stream_request(host: str, port: int, prompt: str, max_tokens: int,
                   clock: Callable[[], float] = time.perf_counter,
                   timeout: float = 30.0) -> RequestResult:
    """POST one streaming completion and time it; errors end up in the result, not raised."""
    result = RequestResult()
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "stream": True})
    try:
        sent = clock()
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            result.error = f"HTTP {resp.status}: {resp.read(200).decode(errors='replace')}"
            return result
        _read_stream(resp, sent, clock, result)
    except (OSError, http.client.HTTPException, ValueError) as e:
        result.error = f"{type(e).__name__}: {e}"
    finally:
        conn.close()
    return result


def _read_stream(resp, sent: float, clock, result: RequestResult) -> None:
    parser, last = SSEParser(), None
    while True:
        chunk = resp.read1(READ_BYTES)
        if not chunk:
            result.error = "the stream ended before data: [DONE]"
            return
        for data in parser.feed(chunk):
            if data == DONE:
                result.ok = True
                return
            body = json.loads(data)
            if "error" in body:  # the server gave up mid-stream (vLLM sends such an event)
                result.error = f"the server sent an error: {body['error']}"
                return
            text = body["choices"][0].get("text") or ""
            if not text:
                continue  # an empty event (a role, a finish reason) is not a token
            now = clock()
            if last is None:
                result.ttft = now - sent
            else:
                result.itls.append(now - last)
            last = now
            result.e2e = now - sent
            result.n_tokens += 1
            result.text += text


def run_load(host: str, port: int, prompts: list[str], max_tokens: int,
             concurrency: int) -> list[RequestResult]:
    """Every prompt once, at most `concurrency` in flight; results in prompt order."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, got {concurrency}")
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        return list(pool.map(lambda p: stream_request(host, port, p, max_tokens), prompts))


def percentile(values: list[float], p: float) -> float:
    """Linear interpolation between closest ranks (numpy.percentile's default)."""
    if not values:
        raise ValueError("no values")
    v = sorted(values)
    rank = (len(v) - 1) * p / 100
    lo = int(rank)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (rank - lo)


def summarize(results: list[RequestResult], duration_s: float) -> dict:
    """Over the successful requests: TTFT, ITL (every gap of every request) and E2E
    percentiles, and output tokens per second of the run."""
    ok = [r for r in results if r.ok]
    out = {"completed": len(ok), "failed": len(results) - len(ok),
           "output_tok_per_s": sum(r.n_tokens for r in ok) / duration_s}
    series = {"ttft": [r.ttft for r in ok if r.ttft is not None],
              "itl": [gap for r in ok for gap in r.itls],
              "e2e": [r.e2e for r in ok if r.e2e is not None]}
    for name, values in series.items():
        for p in (50, 99):
            out[f"{name}_p{p}"] = percentile(values, p) if values else None
    return out


