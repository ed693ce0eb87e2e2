"""`minivllm serve` through the official openai client: a real server subprocess on a free port,
serving the tiny test model (chat template and all), with --api-key set.

One server serves the whole module (its start is the slow part). It runs with its own resource
prefix and temp dir, and the module checks at the end that stopping it left nothing behind.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import socket
import tempfile
import threading
import time

import httpx
import openai
import pytest

from minivllm.entrypoints.openai.server_process import ServerProcess
from minivllm.utils.leaks import Snapshot

API_KEY = "test-key"
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def server(tiny_dir):
    prefix = f"minivllm-srv{os.getpid()}"
    private = tempfile.mkdtemp(prefix=prefix + "-tmp-")
    before = Snapshot(prefix, private_dirs=[private])
    proc = ServerProcess([tiny_dir, "--api-key", API_KEY, "--served-model-name", "tiny"],
                         env={"MINIVLLM_RESOURCE_PREFIX": prefix, "TMPDIR": private})
    try:
        yield proc
    finally:
        code = proc.stop()
        leaks = before.leaks()
        shutil.rmtree(private, ignore_errors=True)
    assert code == 0, f"the server exited with {code} on SIGTERM:\n{proc.output()[-2000:]}"
    assert not leaks, "stopping the server left resources behind:\n" + leaks.describe()


@pytest.fixture
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0)


def metric(server, name: str) -> float:
    text = httpx.get(server.url + "/metrics").text
    match = re.search(rf"^minivllm:{name}(?:{{[^}}]*}})? (\S+)$", text, re.M)
    assert match, f"/metrics has no minivllm:{name}"
    return float(match.group(1))


def test_chat_whole_and_streamed_agree(client):
    whole = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=12,
                                           temperature=0)
    assert whole.id.startswith("chatcmpl-") and whole.object == "chat.completion"
    choice = whole.choices[0]
    assert choice.message.role == "assistant" and choice.finish_reason in ("stop", "length")
    assert whole.usage.completion_tokens <= 12
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens

    chunks = list(client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=12, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    assert len({c.id for c in chunks}) == 1 and chunks[0].id.startswith("chatcmpl-")
    assert chunks[0].choices[0].delta.role == "assistant"
    content = [c for c in chunks if c.choices]
    assert [c.choices[0].finish_reason for c in content][-1] == choice.finish_reason
    assert all(c.choices[0].finish_reason is None for c in content[:-1])
    assert "".join(c.choices[0].delta.content or "" for c in content) == choice.message.content
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage


def test_chat_stream_with_two_choices(client):
    chunks = list(client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=6, n=2, temperature=0, stream=True,
        extra_body={"ignore_eos": True}))
    roles = [c.choices[0].index for c in chunks if c.choices[0].delta.role == "assistant"]
    finished = sorted(c.choices[0].index for c in chunks if c.choices[0].finish_reason)
    assert roles == [0, 1] and finished == [0, 1]
    texts = ["".join(c.choices[0].delta.content or "" for c in chunks if c.choices[0].index == i)
             for i in (0, 1)]
    assert texts[0] == texts[1]  # greedy: both choices decode the same tokens


def test_completions_n_batch_and_no_usage_unless_asked(client):
    out = client.completions.create(model="tiny", prompt=["The capital of", "A paged"],
                                    max_tokens=5, n=2, temperature=0,
                                    extra_body={"ignore_eos": True})
    assert out.id.startswith("cmpl-") and [c.index for c in out.choices] == [0, 1, 2, 3]
    assert out.choices[0].text == out.choices[1].text  # greedy: the two choices agree
    assert out.usage.completion_tokens == 4 * 5
    chunks = list(client.completions.create(model="tiny", prompt="The capital of",
                                            max_tokens=5, stream=True, temperature=0,
                                            extra_body={"ignore_eos": True}))
    assert all(c.usage is None for c in chunks) and chunks[-1].choices[0].finish_reason
    assert "".join(c.choices[0].text for c in chunks) == out.choices[0].text


def test_stop_seed_and_token_prompts(client):
    kwargs = dict(model="tiny", prompt="The capital of France is", max_tokens=16,
                  temperature=1.0, seed=7, extra_body={"ignore_eos": True})
    a, b = (client.completions.create(**kwargs).choices[0].text for _ in range(2))
    assert a == b, "the same seed gave two different samples"
    two = client.completions.create(**{**kwargs, "n": 2})
    assert two.choices[0].text == a  # choice 0 keeps the seed, choice 1 gets seed + 1
    if a.strip():
        stop = a.strip()[0]
        cut = client.completions.create(**kwargs, stop=[stop]).choices[0]
        assert stop not in cut.text and cut.finish_reason == "stop"
    ids = client.completions.create(model="tiny", prompt=[5, 6, 7], max_tokens=3,
                                    temperature=0)
    assert ids.usage.prompt_tokens == 3
    # max_tokens beyond the room the prompt leaves is clamped to it, as vLLM does
    full = client.completions.create(model="tiny", prompt=[5] * 1000, max_tokens=100,
                                     temperature=0, extra_body={"ignore_eos": True})
    assert full.usage.completion_tokens == 1024 - 1000
    assert full.choices[0].finish_reason == "length"


def test_models_health_metrics_and_api_key(server, client):
    assert [m.id for m in client.models.list().data] == ["tiny"]
    assert httpx.get(server.url + "/health").status_code == 200  # no key needed off /v1
    bad = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        bad.models.list()
    assert e.value.status_code == 401 and e.value.body["type"] == "AuthenticationError"
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "x"})
    assert r.status_code == 401
    assert metric(server, "kv_cache_blocks_total") > 0
    assert metric(server, "num_preemptions_total") >= 0  # the engines' count, as vLLM's
    client.completions.create(model="tiny", prompt="x", max_tokens=1)  # one, whatever ran before
    assert metric(server, "time_to_first_token_seconds_count") > 0


def raw_status(port: int, headers: list[bytes], method: bytes = b"GET") -> int:
    """The status of a request with exactly these header lines (two of one name, say)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(method + b" /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                     + b"".join(h + b"\r\n" for h in headers) + b"\r\n")
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return int(answer.split()[1])


def test_the_api_key_is_checked_as_vllm_checks_it(server):
    """vLLM's AuthenticationMiddleware: the scheme in any case, the first Authorization header
    counts, OPTIONS (a CORS preflight) is let through."""
    key = API_KEY.encode()
    assert raw_status(server.port, [b"Authorization: bearer " + key]) == 200
    assert raw_status(server.port, [b"Authorization: BEARER " + key]) == 200
    assert raw_status(server.port, [b"Authorization: Bearer " + key,
                                    b"Authorization: Bearer wrong"]) == 200
    assert raw_status(server.port, [b"Authorization: Bearer wrong",
                                    b"Authorization: Bearer " + key]) == 401
    assert raw_status(server.port, [b"Authorization: Basic " + key]) == 401
    assert raw_status(server.port, [b"Authorization: Bearer " + key + b"x"]) == 401
    assert raw_status(server.port, [b"Authorization: Bearer"]) == 401
    assert raw_status(server.port, [], method=b"OPTIONS") != 401


def malformed_requests(long_prompt: str) -> list[tuple[str, object, int, str | None]]:
    """(path, body, expected status, expected param): every kind of bad request."""
    chat = "/v1/chat/completions"
    comp = "/v1/completions"
    msgs = MESSAGES
    return [
        (chat, b"{not json", 400, None),
        (chat, b"", 400, None),
        (comp, b"[1, 2", 400, None),
        (comp, b"[]", 400, None),
        (chat, {"messages": []}, 400, "messages"),
        (chat, {}, 400, "messages"),
        (chat, {"messages": "hello"}, 400, "messages"),
        (chat, {"messages": msgs, "temperature": 2.5}, 400, "temperature"),
        (chat, {"messages": msgs, "temperature": -0.1}, 400, "temperature"),
        (chat, {"messages": msgs, "max_tokens": 0}, 400, "max_tokens"),
        (chat, {"messages": msgs, "max_completion_tokens": -3}, 400, "max_completion_tokens"),
        (chat, {"messages": msgs, "max_tokens": 100000}, 400, "max_tokens"),
        (chat, {"messages": msgs, "n": 0}, 400, "n"),
        (chat, {"messages": msgs, "n": 1000}, 400, "n"),
        (chat, {"messages": msgs, "n": "two"}, 400, "n"),
        (chat, {"messages": msgs, "top_p": 0}, 400, "top_p"),
        (chat, {"messages": msgs, "model": "gpt-4"}, 404, "model"),
        (chat, {"messages": [{"role": "user", "content": long_prompt}]}, 400, "input_tokens"),
        (comp, {"prompt": long_prompt}, 400, "input_tokens"),
        (comp, {"prompt": []}, 400, "prompt"),
        (comp, {"prompt": [10 ** 6]}, 400, "prompt"),
        (comp, {"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
        (comp, {"prompt": "x", "temperature": 3}, 400, "temperature"),
        (comp, {"prompt": "x", "model": "nope"}, 404, "model"),
        (comp, {"prompt": "x", "seed": 2 ** 70}, 400, None),
    ]


def test_malformed_requests_while_a_stream_runs(server, client):
    done: dict = {}

    def stream() -> None:
        chunks = list(client.completions.create(
            model="tiny", prompt="The capital", max_tokens=200, temperature=0, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
        done["usage"] = chunks[-1].usage
    t = threading.Thread(target=stream)
    t.start()
    cases = malformed_requests("hello " * 1100)  # > the tiny model's 1024-token context
    headers = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=30) as http:
        for i in range(100):
            path, body, status, param = cases[i % len(cases)]
            r = (http.post(path, content=body) if isinstance(body, bytes)
                 else http.post(path, json=body))
            assert r.status_code == status, (path, body, r.text)
            err = r.json()["error"]
            assert set(err) == {"message", "type", "param", "code"} and err["code"] == status
            assert err["message"], (path, body)
            if param is not None:
                assert err["param"] == param, (path, body, err)
    t.join(60)
    assert done["usage"].completion_tokens == 200, "the stream did not finish whole"


def test_disconnect_aborts_and_frees_blocks(server):
    headers = {"Authorization": f"Bearer {API_KEY}"}
    body = {"prompt": "The capital " * 40, "max_tokens": 900, "stream": True,
            "ignore_eos": True}
    finished_before = metric(server, "e2e_request_latency_seconds_count")
    with httpx.stream("POST", server.url + "/v1/completions", json=body, headers=headers,
                      timeout=30) as r:
        lines = r.iter_lines()
        for _ in range(6):
            next(lines)
        assert metric(server, "kv_cache_blocks_used") > 0
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the engine frees the blocks after the abort
        if metric(server, "kv_cache_blocks_used") == 0 == metric(server, "num_requests_running"):
            break
        time.sleep(0.1)
    assert metric(server, "kv_cache_blocks_used") == 0, "the aborted request kept its blocks"
    assert metric(server, "e2e_request_latency_seconds_count") == finished_before, \
        "the request ran to the end instead of being aborted"


def test_disconnect_aborts_a_whole_response_too(server):
    """A non-streamed request: with_cancellation notices the client leaving and cancels it.
    The client leaves as soon as the engine runs the request, long before its 900 tokens."""
    body = json.dumps({"prompt": "The capital " * 40, "max_tokens": 900,
                       "ignore_eos": True}).encode()
    finished_before = metric(server, "e2e_request_latency_seconds_count")
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                     + API_KEY.encode() + b"\r\nContent-Type: application/json\r\n"
                     + b"Content-Length: %d\r\n\r\n" % len(body) + body)
        deadline = time.monotonic() + 10
        while not metric(server, "num_requests_running") and time.monotonic() < deadline:
            time.sleep(0.01)
        assert metric(server, "num_requests_running") == 1
    deadline = time.monotonic() + 10
    while metric(server, "kv_cache_blocks_used") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert metric(server, "kv_cache_blocks_used") == 0, "the aborted request kept its blocks"
    assert metric(server, "num_requests_running") == 0
    assert metric(server, "e2e_request_latency_seconds_count") == finished_before, \
        "the request ran to the end instead of being aborted"


def test_256_concurrent_streams_all_complete(server):
    async def one(aclient: openai.AsyncOpenAI, i: int) -> tuple[str, int, str]:
        stream = await aclient.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": f"request {i}"}], max_tokens=16,
            temperature=0, stream=True, stream_options={"include_usage": True},
            extra_body={"ignore_eos": True})
        text, finish, usage = "", None, 0
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                finish = chunk.choices[0].finish_reason or finish
            if chunk.usage:
                usage = chunk.usage.completion_tokens
        return text, usage, finish

    async def main() -> list:
        http = httpx.AsyncClient(limits=httpx.Limits(max_connections=300), timeout=120)
        aclient = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=API_KEY,
                                     max_retries=0, http_client=http)
        try:
            return await asyncio.gather(*(one(aclient, i) for i in range(256)))
        finally:
            await aclient.close()
    results = asyncio.run(main())
    assert all(usage == 16 and finish == "length" for _, usage, finish in results)


def test_shared_metrics_dir_keeps_the_users_folder_and_removes_only_its_own(tmp_path, monkeypatch):
    from minivllm.entrypoints.openai.metrics import MULTIPROC_ENV, shared_metrics_dir
    from minivllm.utils.run_dir import run_dir

    monkeypatch.delenv(MULTIPROC_ENV, raising=False)
    with shared_metrics_dir() as made:
        assert os.environ[MULTIPROC_ENV] == made and os.path.isdir(made)
        # in the run's folder: removed with it when a killed launcher's run is swept
        assert os.path.dirname(made) == run_dir()
    assert not os.path.exists(made) and MULTIPROC_ENV not in os.environ
    mine = tmp_path / "prometheus"
    mine.mkdir()
    (mine / "counter_1.db").write_bytes(b"a value from an earlier run")
    monkeypatch.setenv(MULTIPROC_ENV, str(mine))
    with shared_metrics_dir() as used:
        assert used == str(mine)
    assert (mine / "counter_1.db").exists() and os.environ[MULTIPROC_ENV] == str(mine)


def test_usage_counts_each_prompt_once_whatever_n(client):
    """OpenAI's and vLLM's usage: prompt tokens once per prompt (not once per choice), every
    choice's completion tokens; streamed usage equals the whole response's."""
    prompt = [5, 6, 7, 8]
    kwargs = dict(model="tiny", max_tokens=3, temperature=0, extra_body={"ignore_eos": True})
    out = client.completions.create(prompt=prompt, n=4, **kwargs)
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (4, 12)
    batch = client.completions.create(prompt=[prompt, [9, 10]], n=2, **kwargs)
    assert (batch.usage.prompt_tokens, batch.usage.completion_tokens) == (6, 12)
    chunks = list(client.completions.create(prompt=[prompt, [9, 10]], n=2, stream=True,
                                            stream_options={"include_usage": True}, **kwargs))
    assert chunks[-1].usage == batch.usage
    chat = client.chat.completions.create(messages=MESSAGES, n=3, **kwargs)
    assert chat.usage.completion_tokens == 9
    streamed = list(client.chat.completions.create(
        messages=MESSAGES, n=3, stream=True, stream_options={"include_usage": True}, **kwargs))
    assert streamed[-1].usage == chat.usage


def test_continuous_usage_stats_on_every_chunk(client):
    kwargs = dict(model="tiny", max_tokens=4, temperature=0, stream=True,
                  stream_options={"include_usage": True, "continuous_usage_stats": True},
                  extra_body={"ignore_eos": True})
    chunks = list(client.completions.create(prompt=[[5, 6, 7], [8, 9]], n=2, **kwargs))
    per_choice: dict[int, list] = {}
    for c in chunks[:-1]:
        per_choice.setdefault(c.choices[0].index, []).append(c.usage)
    for i, usages in per_choice.items():
        assert all(u.prompt_tokens == (3 if i < 2 else 2) for u in usages)
        counts = [u.completion_tokens for u in usages]
        assert counts == sorted(counts) and counts[-1] == 4
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (5, 16)
    chat = list(client.chat.completions.create(messages=MESSAGES, **kwargs))
    assert chat[0].usage.completion_tokens == 0 and chat[-2].usage.completion_tokens == 4
    assert chat[-1].usage == chat[-2].usage


def test_stream_options_without_stream_is_400(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt="x", max_tokens=2,
                                  stream_options={"include_usage": True})
    assert e.value.body["param"] == "stream_options"


def metrics_now(server) -> dict[str, float]:
    """Every minivllm: series, keyed by name and labels but model_name."""
    out = {}
    for line in httpx.get(server.url + "/metrics").text.splitlines():
        if m := re.match(r"^minivllm:(\w+)(?:\{([^}]*)\})? (\S+)$", line):
            labels = ",".join(p for p in (m.group(2) or "").split(",")
                              if p and not p.startswith("model_name"))
            out[m.group(1) + (f"{{{labels}}}" if labels else "")] = float(m.group(3))
    return out


def test_metrics_count_known_traffic_by_outcome(server, client):
    """Two requests end by length, one by a stop token, one aborted mid-stream: the counters
    by finished_reason, the token counters (the aborted one's tokens too), TTFT and e2e."""
    before = metrics_now(server)
    kwargs = dict(model="tiny", prompt=[5, 6, 7], temperature=0)
    for _ in range(2):
        client.completions.create(max_tokens=4, extra_body={"ignore_eos": True}, **kwargs)
    first = client.completions.create(max_tokens=1, logprobs=0, **kwargs,
                                      extra_body={"return_tokens_as_token_ids": True})
    stop_id = int(first.choices[0].logprobs.tokens[0].split(":")[1])
    stopped = client.completions.create(max_tokens=8, extra_body={"stop_token_ids": [stop_id]},
                                        **kwargs)
    assert stopped.choices[0].finish_reason == "stop" and stopped.usage.completion_tokens == 1
    body = {"prompt": [5, 6, 7], "max_tokens": 900, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=30,
                      headers={"Authorization": f"Bearer {API_KEY}"}) as r:
        received = 0
        for line in r.iter_lines():
            received += line.startswith("data: {")
            if received == 5:
                break
    deadline = time.monotonic() + 10
    while (metrics_now(server)['request_success_total{finished_reason="abort"}']
           == before['request_success_total{finished_reason="abort"}']
           and time.monotonic() < deadline):
        time.sleep(0.1)
    after = metrics_now(server)
    delta = {k: after[k] - before.get(k, 0.0) for k in after}
    assert delta['request_success_total{finished_reason="length"}'] == 3  # 2 + the 1-token one
    assert delta['request_success_total{finished_reason="stop"}'] == 1
    assert delta['request_success_total{finished_reason="abort"}'] == 1
    assert delta['request_success_total{finished_reason="error"}'] == 0
    assert delta["prompt_tokens_total"] == 5 * 3
    assert 4 + 4 + 1 + 1 + 5 <= delta["generation_tokens_total"] < 4 + 4 + 1 + 1 + 900
    assert delta["time_to_first_token_seconds_count"] == 5
    assert delta["e2e_request_latency_seconds_count"] == 4  # the aborted one has none
    itl = delta["inter_token_latency_seconds_count"]
    assert itl == delta["generation_tokens_total"] - 5  # every token but each request's first
    assert after["num_requests_running"] == after["num_requests_waiting"] == 0


def test_the_api_server_process_does_not_load_torch(server, client):
    """Only the engine core runs the model: torch in the front end would cost ~180 MiB of RSS
    for nothing (it was loaded through EngineConfig's imports once)."""
    client.models.list()  # the server is up and has served a request
    with open(f"/proc/{server.pid}/maps") as f:
        torch_libs = {line.split()[-1] for line in f if "/torch/" in line}
    assert not torch_libs, f"the API server process maps torch: {sorted(torch_libs)[:3]}"
