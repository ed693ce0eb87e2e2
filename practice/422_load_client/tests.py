"""The judge's tests for exercise 422. Each receives the learner's module as `impl`.

The server is the judge's: stdlib http.server in a thread on 127.0.0.1, streaming SSE on a
schedule it knows (sleeps before each write). Times are checked only where causality makes
them certain (nothing can arrive before the server sent it), or with a margin of seconds
where a bug is off by many seconds; everything else is counted, not timed.
"""

from __future__ import annotations

import inspect
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from minivllm.judge.api import Fail, check_equal, scaled, step, test
from minivllm.judge.properties import for_all, st

FIRST_S = 0.5  # the server's wait before the first token
HEADERS_S = 0.3  # 'steady' sends its response headers this late (a server that queues first)
# Between the tokens of a 'long' stream: 2 s a stream, so a queued request waits 2 s for a
# slot, and a clock started before that wait is off by as much (scaled: a busy machine delays
# the client's reads by seconds; the wait stretches with it).
LONG_GAP_S = scaled(0.3)


def event(text, finish=None) -> bytes:
    return ("data: " + json.dumps({"id": "cmpl-1", "object": "text_completion", "choices": [
        {"index": 0, "text": text, "finish_reason": finish}]}) + "\n\n").encode()


END = event("", "length") + b"data: [DONE]\n\n"
GATE = None  # a step that waits until the client's clock timed a token (see GatedClock)
# A client that parses as bytes come has timed a token long before this; under the 30 s
# socket timeout of stream_request, so that a client that never does still gets its answer.
GATE_S = min(scaled(5.0), 20.0)
# Each scenario: (seconds to sleep, bytes to write), after the response headers.
SCENARIOS = {
    "steady": [(0, event("")), (FIRST_S, event("A")), (0, GATE), (0.1, event("B")),
               (0.3, event("")),  # an event without text between two tokens
               (0.1, event("C")), (0.1, event("D")), (0.1, event("E")), (0, END)],
    "bursty": [(0, b": a comment, not an event\n\n" + event("")), (FIRST_S, event("one ")),
               (0.1, event("two ") + event("three ")),  # two events in one write
               (0.1, event("four\n")[:25]), (0.5, event("four\n")[25:]),  # one event, 2 writes
               (0.1, event("fïve").replace(b"\n\n", b"\r\n\r\n")), (0, END)],
    **{f"long{k}": [(0, event("")), (FIRST_S + (0.5 if k == 0 else 0), event(f"{k}.0 "))]
       + [(LONG_GAP_S, event(f"{k}.{i} ")) for i in range(1, 6)] + [(0, END)] for k in range(4)},
    "cut": [(FIRST_S, event("x")), (0.1, event("y"))],  # closes without [DONE]
    "finished, no done": [(0, event("x")), (0, event("", "length"))],  # a finish event, no [DONE]
    "error": [(0, event("x")), (0, b'data: {"error": {"message": "engine died"}}\n\n')],
    "stall": [(0, event("x")), (0, None)],  # None: silent, the connection open, until the test ends
    "held": [(0, "hold"), (0, event("h")), (0, END)],  # "hold": until HOLD_OPEN were held at once
    "quick": [(0, event("q")), (0, END)],
    "no tokens": [(0, END)],  # a finish event and [DONE], no text (max_tokens 0, say)
}
# The error body of a prompt that is no scenario: not UTF-8 (a proxy's page in latin-1, say).
NO_SCENARIO_BODY = b'{"error": "no such scenario, caf\xe9"}'
# A 503 whose body never ends (a proxy that streams its error page, say): bytes keep coming,
# so no socket timeout fires; a client that reads the whole body waits for ever.
ENDLESS_ERROR = "endless error body"

HOLD_OPEN = 3  # the concurrency of the 'held' check
HOLD_S = scaled(1.0)  # a stream held longer than this waits for streams that never come
STALL_TIMEOUT_S = 1.0  # stream_request's timeout in the stalled-server check


class Server:
    """The judge's SSE server; counts requests and the most streams open at once."""

    def __init__(self):
        judge = self
        self.requests: list[dict] = []
        self.paths: list[str] = []  # the path of each POST
        self.content_types: list[str | None] = []  # the Content-Type header of each POST
        self.arrived: dict[str, float] = {}  # prompt: when its request had been read
        self.first_write: dict[str, float] = {}  # prompt: just before its first token's write
        self.open_now = self.most_open = 0
        self.held_now = self.most_held = 0  # streams waiting in a "hold" step
        self.lock = threading.Condition()
        self.gate, self.gate_missed = threading.Event(), False
        self.released = threading.Event()  # ends the 'stall' scenario's silence

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def send_error_body(self, status, data):
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(data)

            def send_endless_error(self):
                try:
                    self.send_response(503)
                    self.send_header("Content-Type", "text/plain")
                    self.end_headers()
                    while not judge.released.wait(0.005):  # until the client goes or the test ends
                        self.wfile.write(b"overloaded, try again later. " * 4)
                        self.wfile.flush()
                except OSError:
                    pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                judge.requests.append(body)
                judge.paths.append(self.path)
                judge.content_types.append(self.headers.get("Content-Type"))
                judge.arrived[body.get("prompt")] = time.perf_counter()
                # vLLM's check (vllm/entrypoints/serve/utils/api_utils.py:309): lowercased,
                # parameters after ';' ignored
                media = (self.headers.get("Content-Type") or "").lower().split(";")[0]
                if media != "application/json":
                    self.send_error_body(400, b'{"error": "Unsupported Media Type: only '
                                              b'application/json is allowed"}')
                    return
                if body.get("prompt") == ENDLESS_ERROR:
                    self.send_endless_error()
                    return
                steps = SCENARIOS.get(body.get("prompt"))
                if steps is None:
                    self.send_error_body(500, NO_SCENARIO_BODY)
                    return
                with judge.lock:
                    judge.open_now += 1
                    judge.most_open = max(judge.most_open, judge.open_now)
                still_open = [True]

                def close_count():  # once, and before the last write: a client that then
                    with judge.lock:  # sends its next request finds this stream counted out
                        if still_open:
                            still_open.pop()
                            judge.open_now -= 1
                try:
                    time.sleep(HEADERS_S if body["prompt"] == "steady" else 0)
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.end_headers()
                    for i, (delay, data) in enumerate(steps):
                        time.sleep(delay)
                        if i == len(steps) - 1 and isinstance(data, bytes):
                            close_count()
                        if data is GATE:
                            judge.gate_missed |= not judge.gate.wait(GATE_S)
                            continue
                        if data is None:
                            judge.released.wait()
                            continue
                        if data == "hold":
                            judge.hold()
                            continue
                        if b'"text": ""' not in data:
                            judge.first_write.setdefault(body["prompt"], time.perf_counter())
                        self.wfile.write(data)
                        self.wfile.flush()
                except OSError:
                    pass  # the client went away
                finally:
                    close_count()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def hold(self):
        """Wait until HOLD_OPEN streams were held at once (at most HOLD_S)."""
        with self.lock:
            self.held_now += 1
            self.most_held = max(self.most_held, self.held_now)
            self.lock.notify_all()
            self.lock.wait_for(lambda: self.most_held >= HOLD_OPEN, HOLD_S)
            self.held_now -= 1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.released.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()


class GatedClock:
    """time.perf_counter for stream_request's clock; its second reading (the first token, after
    the one at sending) opens the server's gate."""

    def __init__(self, gate: threading.Event):
        self.gate, self.calls = gate, 0

    def __call__(self) -> float:
        self.calls += 1
        if self.calls >= 2:
            self.gate.set()
        return time.perf_counter()


def _check_timing_identity(r, what):
    if r.ttft is None or r.e2e is None:
        raise Fail(f"{what}: ttft and e2e must be set for a request that produced tokens",
                   got=(r.ttft, r.e2e))
    if any(g < 0 for g in r.itls) or abs(r.e2e - (r.ttft + sum(r.itls))) > 1e-6:
        raise Fail(f"{what}: e2e is the time of the last token, so e2e == ttft + sum(itls), "
                   "all from the same timestamps: an ITL runs from one token to the next (an "
                   "event without text in between does not restart it)",
                   expected=r.ttft + sum(r.itls), got=r.e2e)


@test(input="SSEParser.feed of: a comment; 'data:x' (no space); 'data: {...}' with \\r\\n line "
            "ends; two data lines in one event; 'data:  two spaces, a tail  '; 'data: fïve 🤗'; "
            "data: [DONE]; fed whole and one byte at a time")
def sse_parser(impl):
    wire = (b": keep-alive\n\n" b"data:x\n\n" b'data: {"a": 1}\r\n\r\n'
            b"data: first line\ndata: second line\n\n" b"data:  two spaces, a tail  \n\n"
            + "data: fïve 🤗\n\n".encode() + b"data: [DONE]\n\n")
    want = ["x", '{"a": 1}', "first line\nsecond line", " two spaces, a tail  ", "fïve 🤗",
            "[DONE]"]
    step("SSEParser().feed(the whole stream)")
    check_equal(impl.SSEParser().feed(wire), want, "SSEParser().feed(the whole stream): one "
                "space after 'data:' is dropped, and only that one; the rest is the data as sent")
    step("SSEParser().feed(one byte), once per byte of the stream")
    p = impl.SSEParser()
    got = []
    for i in range(len(wire)):
        got += p.feed(wire[i:i + 1])
    check_equal(got, want, "the events from feeding one byte at a time (keep the bytes of an "
                           "unfinished event until its blank line arrives, and decode an event "
                           "only whole: a character's bytes may come in different feeds)")
    step(f"SSEParser().feed of {STREAMS} drawn streams, cut into feeds at drawn offsets")
    for_all(_sse_streams(), lambda case: _check_chunks(impl, *case), examples=STREAMS,
            what="(the stream's bytes, the feeds' end offsets, the events' data)")


STREAMS = 150  # streams cut at arbitrary points: the same on every run (hypothesis, derandomized)
# Line text: anything but CR and LF, often a character that str.splitlines() would break at.
LINE_TEXT = st.text(st.one_of(st.sampled_from("a :é東🤗\u2028\x85\x0b\x1c"),
                              st.characters(exclude_characters="\r\n",
                                            exclude_categories=("Cs",))), max_size=6)


@st.composite
def _sse_streams(draw):
    """Events of data lines (with and without the space after 'data:') and comment lines,
    lines ending in LF or CRLF, and where the feeds end: (bytes, ends, the events' data)."""
    wire, want = "", []
    for lines in draw(st.lists(st.lists(st.tuples(st.sampled_from(["data: ", "data:", ":"]),
                                                  LINE_TEXT), max_size=3), max_size=5)):
        data = []
        for field, text in lines:
            wire += field + text + draw(st.sampled_from(["\n", "\r\n"]))
            if field != ":":
                data.append((field + text)[5:].removeprefix(" "))
        wire += draw(st.sampled_from(["\n", "\r\n"]))
        if data:
            want.append("\n".join(data))
    raw = wire.encode()
    ends = sorted(draw(st.lists(st.integers(0, len(raw)), max_size=8)))
    return raw, ends, want


def _check_chunks(impl, raw, ends, want):
    p, got, start = impl.SSEParser(), [], 0
    for end in ends + [len(raw)]:
        got += p.feed(raw[start:end])
        start = end
    check_equal(got, want, "the events' data from feeding the stream cut at those offsets (an "
                "event ends at a blank line, LF or CRLF; lines end only at LF or CRLF, not at "
                "the other line breaks str.splitlines() knows; ':' lines are comments)")


@test(input="'steady': headers after 0.3 s, an empty-text event at once, then A after 0.5 s; "
            "B only once "
            "the client's clock timed A; an empty-text event; C D E 0.1 s apart, a finish "
            "event, [DONE]", timeout=40)
def one_stream(impl):
    with Server() as s:
        clock = GatedClock(s.gate)
        r = impl.stream_request("127.0.0.1", s.port, "steady", 5, clock=clock)
    if clock.calls == 0:
        raise Fail("stream_request never called the `clock` it was given: take every time (the "
                   "send, each token) from `clock`, not from time.perf_counter itself",
                   got=(r.ttft, r.itls))
    if s.gate_missed:
        raise Fail(f"the client timed no token within {GATE_S:g} s of receiving A while the "
                   "stream stayed open: its read waits for more bytes (resp.read(n) waits for "
                   "n bytes or the end of the stream); read what has come with resp.read1(n) "
                   "and time each event as it is parsed", got=r)
    check_equal(s.requests[0], {"prompt": "steady", "max_tokens": 5, "stream": True},
                "the JSON body the server received")
    check_equal(s.content_types[0], "application/json", "the request's Content-Type header "
                "(vLLM's server answers 400 to a body of any other media type)")
    check_equal((r.ok, r.error, r.text, r.n_tokens), (True, "", "ABCDE", 5),
                "(ok, error, text, n_tokens)")
    check_equal(len(r.itls), 4, "len(itls): one gap per pair of consecutive tokens (the wait "
                                "for the first token is TTFT, not an ITL)")
    if r.ttft < HEADERS_S + FIRST_S - 1e-3:
        raise Fail(f"ttft is {r.ttft:.3f} s, but the first token was sent {HEADERS_S + FIRST_S:g} "
                   "s after the request arrived: TTFT runs from sending the request to the first "
                   f"event with text (not from the headers, sent {HEADERS_S:g} s late, and not "
                   "to an empty event)", expected=f">= {HEADERS_S + FIRST_S:g}", got=r.ttft)
    _check_timing_identity(r, "steady")


@test(input="'bursty': a comment; an empty event; tokens 'one ', then 'two ' and 'three ' in "
            "one write, 'four\\n' in two writes 0.5 s apart, 'fïve' with \\r\\n line ends; "
            "'no tokens': a finish event and [DONE]", timeout=30)
def bursts_and_split_events(impl):
    with Server() as s:
        step("stream_request(..., 'bursty', 5)")
        r = impl.stream_request("127.0.0.1", s.port, "bursty", 5)
        step("stream_request(..., 'no tokens', 5)")
        empty = impl.stream_request("127.0.0.1", s.port, "no tokens", 5)
    step("the result of 'bursty'")
    check_equal((r.ok, r.error, r.text), (True, "", "one two three four\nfïve"),
                "(ok, error, text): events are parsed from the bytes, whatever the reads")
    check_equal((r.n_tokens, len(r.itls)), (5, 4),
                "(n_tokens, len(itls)): one token per event with text, two events in one read "
                "are two tokens")
    _check_timing_identity(r, "bursty")
    step("the result of 'no tokens'")
    check_equal((empty.ok, empty.n_tokens, empty.ttft, empty.e2e, empty.itls),
                (True, 0, None, None, []),
                "(ok, n_tokens, ttft, e2e, itls) of a stream without tokens: ttft and e2e stay "
                "None until a token arrives (not 0: summarize would count a TTFT that never was)")


@test(input="stream_request's signature; HTTP 500 ('no such scenario', a body in latin-1); 'cut' "
            "(2 tokens, then the server closes without [DONE]); 'finished, no done' (a token and "
            "a finish event, then the server closes); 'error' (1 token, then data: {\"error\": "
            "...}); 'stall' (1 token, then silence) with timeout=1; HTTP 503 whose body never "
            "ends, timeout=1; a port nobody listens on", timeout=30)
def failures(impl):
    step("inspect.signature(stream_request)")
    check_equal(inspect.signature(impl.stream_request).parameters["timeout"].default, 30.0,
                "the default timeout of stream_request (the README fixes the signature)")
    with Server() as s:
        step("stream_request(..., 'no such scenario', 5): HTTP 500, a body in latin-1")
        bad = impl.stream_request("127.0.0.1", s.port, "no such scenario", 5)
        if bad.ok or "500" not in bad.error:
            decoding = "Decode" in bad.error
            raise Fail("an HTTP 500 response: ok False and its status code, 500, in error" + (
                       " (its body is latin-1, not UTF-8: decode it so that no byte can fail, "
                       "errors='replace', or leave it out)" if decoding else ""),
                       expected=(False, "... 500 ..."), got=(bad.ok, bad.error))
        step("stream_request(..., 'cut', 5): 2 tokens, then the server closes")
        cut = impl.stream_request("127.0.0.1", s.port, "cut", 5)
        if cut.ok or not cut.error:
            raise Fail("a stream that ends without data: [DONE]: ok False and an error that "
                       "says so", got=(cut.ok, cut.error))
        check_equal(cut.n_tokens, 2, "n_tokens of the cut stream (what did arrive is kept)")
        step("stream_request(..., 'finished, no done', 5): a token, a finish event, the end")
        finished = impl.stream_request("127.0.0.1", s.port, "finished, no done", 5)
        if finished.ok or not finished.error or finished.n_tokens != 1:
            raise Fail("a stream with a finish event (finish_reason 'length') that ends without "
                       "data: [DONE]: ok False and an error, the token kept (ok is True only "
                       "once [DONE] arrives, not at a finish reason)",
                       expected=(False, "an error", 1),
                       got=(finished.ok, finished.error, finished.n_tokens))
        step("stream_request(..., 'error', 5): a token, then data: {\"error\": ...}")
        try:
            err = impl.stream_request("127.0.0.1", s.port, "error", 5)
        except Exception as e:
            raise Fail("stream_request raised on an error event (data: {\"error\": ...}, no "
                       "choices): a server's error mid-stream is ok False and a message in "
                       "error, never an exception", got=repr(e)) from None
        if err.ok or "engine died" not in err.error or err.n_tokens != 1:
            raise Fail("an error event after one token: ok False, the server's message in error, "
                       "the token kept", expected=(False, "...engine died...", 1),
                       got=(err.ok, err.error, err.n_tokens))
        step(f"stream_request(..., 'stall', 5, timeout={STALL_TIMEOUT_S:g}): a token, then silence")
        _check_gives_up_on_a_silent_server(impl, s)
        step(f"stream_request(..., {ENDLESS_ERROR!r}, 5, timeout={STALL_TIMEOUT_S:g}): HTTP 503")
        _check_endless_error_body(impl, s)
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # nobody listens there now
    step("stream_request(..., a port nobody listens on, 'steady', 5)")
    refused = impl.stream_request("127.0.0.1", port, "steady", 5)
    if refused.ok or not refused.error:
        raise Fail("a refused connection: ok False and the error, not an exception",
                   got=(refused.ok, refused.error))


def _check_gives_up_on_a_silent_server(impl, server):
    done = {}
    t = threading.Thread(target=lambda: done.setdefault("r", impl.stream_request(
        "127.0.0.1", server.port, "stall", 5, timeout=STALL_TIMEOUT_S)), daemon=True)
    t.start()
    t.join(STALL_TIMEOUT_S + scaled(4.0))
    if t.is_alive():
        raise Fail(f"stream_request(..., timeout={STALL_TIMEOUT_S:g}) was still waiting "
                   f"{STALL_TIMEOUT_S + scaled(4.0):g} s into a stream that went silent after "
                   "one token: a silent server must end the request with ok=False after "
                   "`timeout` seconds without bytes (give the connection that timeout)")
    r = done["r"]
    if r.ok or not r.error or r.n_tokens != 1:
        raise Fail("a stream silent for longer than `timeout` after one token: ok False, an "
                   "error, and the token that did arrive kept",
                   expected=(False, "an error", 1), got=(r.ok, r.error, r.n_tokens))


def _check_endless_error_body(impl, server):
    done, limit = {}, STALL_TIMEOUT_S + scaled(4.0)
    t = threading.Thread(target=lambda: done.setdefault("r", impl.stream_request(
        "127.0.0.1", server.port, ENDLESS_ERROR, 5, timeout=STALL_TIMEOUT_S)), daemon=True)
    t.start()
    t.join(limit)
    if t.is_alive():
        raise Fail(f"stream_request(..., timeout={STALL_TIMEOUT_S:g}) was still reading {limit:g} s "
                   "into an HTTP 503 whose body never ends (bytes keep coming, so no timeout "
                   "fires): put the status in `error` with at most a bounded part of the body "
                   "(resp.read(200)), never the body read to its end; the README: never a hang")
    r = done["r"]
    if r.ok or "503" not in (r.error or ""):
        raise Fail("an HTTP 503 whose body never ends: ok False and the status in error",
                   expected=(False, "... 503 ..."), got=(r.ok, r.error))


def _result(impl, ttft, itls, n, ok=True):
    return impl.RequestResult(ok=ok, ttft=ttft, itls=list(itls), e2e=ttft + sum(itls),
                              n_tokens=n, text="x" * n)


@test(input="summarize of 3 results (TTFT 1, 2, 4; ITLs [0.1]*3, [0.5], []) and a failed one, "
            "over 10 s")
def summarize_math(impl):
    step("percentile([5.0], 50), percentile([1.0, 2.0, 3.0], 100), percentile([1.0, 2.0, 3.0], 0)")
    check_equal([impl.percentile([5.0], 50), impl.percentile([1.0, 2.0, 3.0], 100),
                 impl.percentile([1.0, 2.0, 3.0], 0)], [5.0, 3.0, 1.0],
                "[percentile([5], 50), percentile([1, 2, 3], 100), percentile([1, 2, 3], 0)] "
                "(one value; the ends)")
    rs = [_result(impl, 1.0, [0.1, 0.1, 0.1], 4), _result(impl, 2.0, [0.5], 2),
          _result(impl, 4.0, [], 1), _result(impl, 9.0, [9.0], 2, ok=False)]
    step("summarize(3 successful results and a failed one, 10.0)")
    got = impl.summarize(rs, 10.0)
    want = {"completed": 3, "failed": 1, "output_tok_per_s": 0.7,
            "ttft_p50": 2.0, "ttft_p99": 3.96, "itl_p50": 0.1, "itl_p99": 0.488,
            "e2e_p50": 2.5, "e2e_p99": 3.97}
    if set(got) != set(want):
        raise Fail("summarize()'s keys", expected=sorted(want), got=sorted(got))
    wrong = {k: (got[k], v) for k, v in want.items()
             if not isinstance(got[k], (int, float)) or abs(got[k] - v) > 1e-9}
    if wrong:
        rules = {"completed": "completed and failed count results by ok; output_tok_per_s is "
                              "the successful requests' tokens / duration_s",
                 "ttft": "percentiles interpolate linearly between ranks (numpy's default), "
                         "over the successful requests only",
                 "itl": "ITL percentiles are over every gap of every successful request (not "
                        "over per-request means)"}
        said = dict.fromkeys(rules["itl" if k.startswith("itl") else "ttft" if "_p" in k[-4:]
                                   else "completed"] for k in wrong)
        raise Fail("summarize(): " + "; ".join(said),
                   expected={k: v for k, (_, v) in wrong.items()},
                   got={k: g for k, (g, _) in wrong.items()})
    step("summarize(one failed result, 10.0)")
    none = {k: None for k in want if k.endswith(("_p50", "_p99"))}
    check_equal(impl.summarize(rs[3:], 10.0), {"completed": 0, "failed": 1,
                                               "output_tok_per_s": 0.0, **none},
                "summarize of one failed result (no values: None, not an error)")


@test(input="run_load: prompts long0..long3 (first token after 0.5 s, 1 s for long0, then 5 "
            "more 0.3 s apart; distinct texts), 'no such scenario' between them (HTTP 500), "
            "concurrency 2", timeout=60)
def concurrent_load(impl):
    prompts = ["long0", "long1", "no such scenario", "long2", "long3"]
    with Server() as s:
        rs = impl.run_load("127.0.0.1", s.port, prompts, 6, 2)
        most = s.most_open
    if not isinstance(rs, list) or len(rs) != len(prompts):
        raise Fail(f"run_load of {len(prompts)} prompts must return {len(prompts)} results, one "
                   "per prompt (a failed request too, with ok False)",
                   got=len(rs) if hasattr(rs, "__len__") else rs)
    want = [f"{k}.0 {k}.1 {k}.2 {k}.3 {k}.4 {k}.5 " for k in range(4)]
    check_equal([(r.ok, r.text) for r in rs], [(True, want[0]), (True, want[1]), (False, ""),
                                               (True, want[2]), (True, want[3])],
                "(ok, text) of each result: results in prompt order (long0 finishes after "
                "long1 and the failed one), not in the order they finished")
    check_equal((len(s.requests), most), (5, 2), "(requests the server got, the most streams "
                                                 "open at once) with concurrency 2")
    check_equal(sorted({r["max_tokens"] for r in s.requests}), [6],
                "the max_tokens the server got (run_load's max_tokens is 6, its concurrency 2)")
    check_equal(sorted(set(s.paths)), ["/v1/completions"],
                "the paths the server got (POST /v1/completions)")
    ttfts = {p: round(r.ttft, 2) for p, r in zip(prompts, rs) if r.ok}
    early = {p: t for p, t in ttfts.items() if t < FIRST_S - 1e-3}
    # long2 and long3 wait about 2 s for a free slot. A clock started when the request was sent
    # reads about first_write - arrived (0.5 s); one started when the run started reads the
    # slot's wait more. The line between them is half that wait, about 1 s from either, which
    # no delay of a submit or a read on a busy machine comes near.
    start = min(s.arrived.values())
    limit = {p: round(s.first_write[p] - s.arrived[p] + (s.arrived[p] - start) / 2, 2)
             for p in ("long2", "long3")}
    if early or any(ttfts[p] >= limit[p] for p in limit):
        raise Fail(f"TTFTs outside [{FIRST_S:g} s, the time from sending to the first token plus "
                   "half the wait for a slot): each request's clock starts when that request is "
                   "sent, not when the run starts (long2 and long3 wait for a free slot first)",
                   expected=f"long2 and long3 under {limit}", got=ttfts)


@test(input=f"run_load: 4 prompts 'held' (each stream waits until {HOLD_OPEN} were waiting at "
            f"once), concurrency {HOLD_OPEN}", timeout=60)
def uses_its_concurrency(impl):
    with Server() as s:
        rs = impl.run_load("127.0.0.1", s.port, ["held"] * 4, 1, HOLD_OPEN)
        most = s.most_held  # a stream leaves the hold before it ends: the 4th cannot meet 3
    if not isinstance(rs, list) or len(rs) != 4:
        raise Fail("run_load of 4 equal prompts must return 4 results, one per request sent, "
                   "even where prompts repeat (do not key results by prompt)",
                   got=len(rs) if hasattr(rs, "__len__") else rs)
    check_equal([(r.ok, r.text) for r in rs], [(True, "h")] * 4, "(ok, text) of each result")
    if len({id(r) for r in rs}) != len(rs):
        raise Fail("run_load of 4 equal prompts returned the same result object more than once: "
                   "one result per request sent, even where prompts repeat (do not key results "
                   "by prompt)", got=f"{len({id(r) for r in rs})} distinct results of {len(rs)}")
    check_equal(most, HOLD_OPEN, f"the most streams waiting at once with concurrency "
                                 f"{HOLD_OPEN} (use the concurrency given: every slot open "
                                 "while streams wait, no more)")


@test(input="run_load: 'quick' twice (a token and [DONE]) with concurrency 1; then 'quick' with "
            "concurrency 0")
def concurrency_one_and_zero(impl):
    with Server() as s:
        step("run_load(..., ['quick', 'quick'], 1, concurrency=1)")
        rs = impl.run_load("127.0.0.1", s.port, ["quick", "quick"], 1, 1)
        check_equal(([(r.ok, r.text) for r in rs], s.most_open), ([(True, "q")] * 2, 1),
                    "([(ok, text) of each result], the most streams open at once) with "
                    "concurrency 1: one request after the other (1 is a valid concurrency)")
        step("run_load(..., ['quick'], 1, concurrency=0)")
        try:
            got = impl.run_load("127.0.0.1", s.port, ["quick"], 1, 0)
        except ValueError:
            return
    raise Fail("run_load(..., concurrency=0) must raise ValueError (no request can ever be "
               "open), not run anyway", got=got)
