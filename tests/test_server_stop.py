"""A stop under load: SIGTERM while streams and whole requests run. Every request still gets an
OpenAI answer (a 503 error body for a whole response; an error event, then `data: [DONE]`, for
a stream), a new connection is refused at once rather than left waiting, the server logs one
line for the stop and no traceback, and it exits 0 leaving nothing behind.
"""

from __future__ import annotations

import json
import signal
import socket
import threading
import time

import httpx
import psutil

from minivllm.entrypoints.openai.server_process import ServerProcess

STREAMS = 4
WHOLE = 4
LONG = {"prompt": "The capital", "max_tokens": 900, "ignore_eos": True}


def read_stream(url: str, out: list) -> None:
    try:
        with httpx.stream("POST", url + "/v1/completions", json={**LONG, "stream": True},
                          timeout=120) as r:
            out.append(r.status_code)
            for line in r.iter_lines():
                if line.startswith("data: "):
                    out.append(line[6:])
    except httpx.HTTPError as e:
        out.append(f"client error: {e!r}")


def read_whole(url: str, out: list) -> None:
    try:
        r = httpx.post(url + "/v1/completions", json=LONG, timeout=120)
        out.append((r.status_code, r.headers.get("content-type"), r.text))
    except httpx.HTTPError as e:
        out.append(f"client error: {e!r}")


def connect_outcome(port: int) -> str:
    """"refused", "accepted" or "timeout" for one new connection."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=3):
            return "accepted"
    except ConnectionRefusedError:
        return "refused"
    except (socket.timeout, TimeoutError):
        return "timeout"


def test_sigterm_under_load_answers_every_request_and_refuses_new_connections(tiny_dir):
    server = ServerProcess([tiny_dir])
    before = ""
    try:
        streams = [[] for _ in range(STREAMS)]
        wholes = [[] for _ in range(WHOLE)]
        threads = ([threading.Thread(target=read_stream, args=(server.url, s)) for s in streams]
                   + [threading.Thread(target=read_whole, args=(server.url, w)) for w in wholes])
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while min(map(len, streams)) < 4 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert min(map(len, streams)) >= 4, "the streams did not start"
        before = server.output()
        server.proc.send_signal(signal.SIGTERM)
        outcomes = []
        while server.returncode is None and len(outcomes) < 50:
            outcomes.append(connect_outcome(server.port))
            if outcomes[-1] != "accepted":
                break
            time.sleep(0.01)
        for t in threads:
            t.join(60)
        code = server.wait(30)
    finally:
        server.stop()
        log = server.output()[len(before):]
        server.log.close()
    # a connection made before the handler ran may be accepted; none waits unanswered
    assert outcomes and outcomes[-1] == "refused", outcomes
    for events in streams:
        assert events[0] == 200 and events[-1] == "[DONE]", events[-3:]
        error = json.loads(events[-2])["error"]
        assert error["code"] == 503 and "shutting down" in error["message"], error
    for (status, media, text), in wholes:
        assert (status, media) == (503, "application/json"), text[:300]
        assert "shutting down" in json.loads(text)["error"]["message"]
    assert code == 0, log[-3000:]
    assert log.count("stopping;") == 1 and "Traceback" not in log, log[-3000:]
    assert "SIGTERM received" in log, log[-3000:]


def test_an_api_server_dying_at_dp_2_leaves_the_others_requests_answered(tiny_dir):
    """kill -9 of one of two API servers: the launcher stops the other, whose requests all
    get OpenAI answers; those the dead one held end with the connection (nothing can answer
    them)."""
    server = ServerProcess([tiny_dir, "-dp", "2"])
    try:
        deadline = time.monotonic() + 60
        while "processes:" not in server.output() and time.monotonic() < deadline:
            time.sleep(0.1)
        api = [p for p in psutil.Process(server.pid).children(recursive=True)
               if "APIServer" in " ".join(p.cmdline())]
        assert len(api) == 2, [p.cmdline() for p in api]
        streams = [[] for _ in range(2 * STREAMS)]
        wholes = [[] for _ in range(2 * WHOLE)]
        threads = ([threading.Thread(target=read_stream, args=(server.url, s)) for s in streams]
                   + [threading.Thread(target=read_whole, args=(server.url, w)) for w in wholes])
        for t in threads:
            t.start()
        while min(map(len, streams)) < 4 and time.monotonic() < deadline + 60:
            time.sleep(0.02)
        api[0].kill()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads), "a request was left waiting"
        code = server.wait(30)
    finally:
        server.stop()
        log = server.output()
        server.log.close()
    answered = 0
    for events in streams:
        if events[-1].startswith("client error"):
            continue  # held by the killed server
        answered += 1
        assert events[-1] == "[DONE]" and "shutting down" in events[-2], events[-3:]
    for (result,) in wholes:
        if isinstance(result, str):
            continue
        answered += 1
        status, media, text = result
        assert (status, media) == (503, "application/json"), text[:300]
    assert answered > 0, "no request reached the surviving API server"
    assert code == 1 and log.count("stopping;") == 1, log[-3000:]
