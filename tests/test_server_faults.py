"""`minivllm serve` when things die, and its process layouts: kill -9 on the engine core (and on a
tensor-parallel worker), several API servers sharing one port, and the --trace file.

Each test starts its own server inside the test, so the suite's leak check sees everything the
server made: after the server exits, no process, segment or socket file may remain.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
import signal
import threading
import time

import httpx
import psutil
import pytest

from minivllm.entrypoints.openai.server_process import ServerProcess, http_status
from minivllm.utils.process_count import serve_process_count

EXIT_DEADLINE_S = 10.0  # the bound: the server is gone this long after the engine dies


def descendants(pid: int, marker: str) -> list[psutil.Process]:
    return [p for p in psutil.Process(pid).children(recursive=True)
            if marker in " ".join(p.cmdline())]


def stream_events(url: str, out: list[str]) -> None:
    """Read one long completion stream into `out`, one SSE data payload an item."""
    body = {"prompt": "The capital", "max_tokens": 900, "stream": True, "ignore_eos": True}
    try:
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    out.append(line[6:])
    except httpx.HTTPError as e:
        out.append(f"client error: {e!r}")


def kill_and_watch(server: ServerProcess, victim: psutil.Process) -> None:
    """Kill `victim` mid-stream; check 503, the stream's error event, the exit within 10 s."""
    events: list[str] = []
    reader = threading.Thread(target=stream_events, args=(server.url, events))
    reader.start()
    deadline = time.monotonic() + 30
    while len(events) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(events) >= 3, "the stream did not start"
    victim.kill()
    killed = time.monotonic()
    statuses = set()
    while server.returncode is None and time.monotonic() - killed < EXIT_DEADLINE_S:
        statuses.add(http_status(server.url + "/health", timeout=0.5))
        time.sleep(0.05)
    code = server.wait(max(0.0, EXIT_DEADLINE_S - (time.monotonic() - killed)))
    reader.join(10)
    assert code is not None, f"the server still runs {EXIT_DEADLINE_S:g} s after the death"
    assert code != 0
    assert 503 in statuses, f"/health never said 503 (saw {statuses})"
    assert events[-1] == "[DONE]" and '"error"' in events[-2], events[-3:]
    assert "dead" in json.loads(events[-2])["error"]["message"]


def test_kill_engine_core(tiny_dir):
    with ServerProcess([tiny_dir]) as server:
        (core,) = descendants(server.pid, "EngineCore")
        kill_and_watch(server, core)


def _has_tensor_parallel() -> bool:
    from minivllm.engine.config import EngineConfig
    names = {f.name for f in dataclasses.fields(EngineConfig)}
    return ("tensor_parallel_size" in names
            and importlib.util.find_spec("minivllm.executor.multiproc_executor") is not None)


@pytest.mark.skipif(not _has_tensor_parallel(), reason="needs the multiprocess executor (-tp)")
def test_kill_tensor_parallel_worker(tiny_dir):
    with ServerProcess([tiny_dir, "-tp", "3"]) as server:
        workers = descendants(server.pid, "Worker")
        assert len(workers) == 3, [p.cmdline() for p in workers]
        kill_and_watch(server, workers[1])


def test_two_api_servers_and_two_engines_share_the_port_and_trace(tiny_dir, tmp_path):
    trace = str(tmp_path / "trace.json")
    with ServerProcess([tiny_dir, "-dp", "2", "--api-server-count", "2", "--trace", trace]
                       ) as server:
        deadline = time.monotonic() + 60  # /health answers once the first server is up
        while "processes:" not in server.output() and time.monotonic() < deadline:
            time.sleep(0.1)
        # the launcher, 2 API servers, 2 engine cores; chapter 01 adds vLLM's DP coordinator
        expected = serve_process_count(dp=2, api_server_count=2)
        assert f"processes: {expected.total - 1} running" in server.output(), server.output()
        api = descendants(server.pid, "APIServer")
        cores = descendants(server.pid, "EngineCore")
        assert (len(api), len(cores)) == (expected.api_servers, expected.engine_cores)
        for i in range(8):  # new connections: the kernel spreads them over the two
            r = httpx.post(server.url + "/v1/completions", timeout=30,
                           json={"prompt": f"hello {i}", "max_tokens": 4, "stream": True,
                                 "ignore_eos": True})
            assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n")
        for _ in range(6):  # whichever server answers the scrape reports both servers' tokens
            text = httpx.get(server.url + "/metrics", timeout=30).text
            assert re.search(r"^minivllm:generation_tokens_total\{[^}]*\} 32\.0$", text, re.M), \
                [line for line in text.splitlines() if "generation_tokens" in line]
        code = server.stop()
    assert code == 0, server.output()[-2000:]
    events = json.load(open(trace))["traceEvents"]
    names = {e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert {"MINIVLLM::APIServer_0", "MINIVLLM::APIServer_1"} <= names, names
    assert {"MINIVLLM::EngineCore_0", "MINIVLLM::EngineCore_1"} <= names, names
    spans = {e["name"] for e in events if e["ph"] == "X"}
    assert {"http_parse", "tokenize", "send", "detokenize", "sse_write", "input", "schedule",
            "execute_model", "forward", "sample", "update_from_output", "output"} <= spans, spans


@pytest.mark.skipif(not _has_tensor_parallel(), reason="needs the multiprocess executor (-tp)")
def test_trace_of_tensor_parallel_workers(tiny_dir, tmp_path):
    trace = str(tmp_path / "trace.json")
    with ServerProcess([tiny_dir, "-tp", "3", "--trace", trace]) as server:
        r = httpx.post(server.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 4},
                       timeout=30)
        assert r.status_code == 200
        assert server.stop() == 0, server.output()[-2000:]
    events = json.load(open(trace))["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    by_process: dict[str, set] = {}
    for e in events:
        if e["ph"] == "X":
            by_process.setdefault(procs.get(e["pid"], "?"), set()).add(e["name"])
    assert {"broadcast", "wait_reply"} <= by_process["MINIVLLM::EngineCore_0"], by_process
    for worker in ("MINIVLLM::Worker_TP0", "MINIVLLM::Worker_TP1", "MINIVLLM::Worker_TP2"):
        assert {"forward"} <= by_process.get(worker, set()), by_process


def test_sigterm_stops_a_single_server_cleanly(tiny_dir):
    server = ServerProcess([tiny_dir])
    try:
        assert "processes: 2 running" in server.output()
        server.proc.send_signal(signal.SIGTERM)
        assert server.wait(EXIT_DEADLINE_S) == 0, server.output()[-2000:]
    finally:
        server.stop()
        server.log.close()
