"""The leader's side of tests/test_multinode_netns.py, run as a process on a namespace host:

    python tests/multinode_driver.py generate '{"tensor_parallel_size": 3, ...}'
    python tests/multinode_driver.py generate_per_line '{...}'
    python tests/multinode_driver.py until_dead '{...}'

    python tests/multinode_driver.py probe '{"url": "http://10.77.0.1:8000"}'
    python tests/multinode_driver.py chat '{"url": "http://10.77.0.1:8000"}'

generate: greedy tokens of the chat prompt, as one JSON line. generate_per_line: the same,
then again for every line read on stdin, until EOF (one engine, several runs). until_dead: prints "generating",
then generates until the engine dies; prints the time EngineDeadError was raised (time.time():
one clock for every namespace of the machine) and its message, as one JSON line. probe (an
HTTP client on some host): waits for /health, starts a long stream, prints "streaming", then
polls /health until it answers 503 or stops answering; prints the statuses and when the 503
came, as one JSON line. chat (a client on some host): waits for /health, asks QUESTION
through the official `openai` client, greedy, and prints the answer's text, finish reason
and token ids (logprobs with vLLM's return_tokens_as_token_ids) as one JSON line.
"""

import itertools
import json
import sys
import time

from minivllm.engine.exceptions import EngineDeadError
from minivllm.entrypoints.llm import LLM
from minivllm.sampling_params import SamplingParams

QUESTION = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
LONG = 100_000  # more tokens than the run can make before the test's fault: capped by the model


def main(mode: str, engine_args: dict) -> None:
    with LLM(**engine_args) as llm:
        if mode in ("generate", "generate_per_line"):
            params = SamplingParams(temperature=0.0, max_tokens=8)
            for _ in itertools.chain([None], sys.stdin if mode == "generate_per_line" else []):
                out = llm.chat(QUESTION, params, use_tqdm=False)[0].outputs[0]
                print(json.dumps({"tokens": list(out.token_ids), "text": out.text}), flush=True)
            return
        params = SamplingParams(temperature=0.0, max_tokens=LONG, ignore_eos=True)
        print("generating", flush=True)
        try:
            llm.generate(["The capital"] * 4, params, use_tqdm=False)
            print(json.dumps({"error": None}), flush=True)
        except EngineDeadError as e:
            print(json.dumps({"dead_at": time.time(), "error": str(e)}), flush=True)


def probe(url: str, timeout: float = 300.0) -> None:
    import threading

    import httpx
    deadline = time.monotonic() + timeout
    while status(url) != 200 and time.monotonic() < deadline:
        time.sleep(0.2)
    events: list[str] = []

    def stream() -> None:
        body = {"prompt": "The capital", "max_tokens": 900, "stream": True, "ignore_eos": True}
        try:
            with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
                events.extend(line[6:] for line in r.iter_lines() if line.startswith("data: "))
        except httpx.HTTPError as e:
            events.append(f"client error: {e!r}")

    reader = threading.Thread(target=stream, daemon=True)
    reader.start()
    while not events and reader.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    print("streaming", flush=True)
    statuses, at = [], None
    while at is None and time.monotonic() < deadline:
        statuses.append(status(url))
        if statuses[-1] in (503, None):
            at = time.time()
        time.sleep(0.05)
    reader.join(30)
    print(json.dumps({"statuses": sorted(set(map(str, statuses))), "at": at,
                      "last_events": events[-2:]}), flush=True)


def chat(url: str, timeout: float = 300.0) -> None:
    import openai
    deadline = time.monotonic() + timeout
    while status(url) != 200 and time.monotonic() < deadline:
        time.sleep(0.2)
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    model = client.models.list().data[0].id
    reply = client.chat.completions.create(
        model=model, messages=QUESTION, temperature=0.0, max_tokens=8, logprobs=True,
        extra_body={"return_tokens_as_token_ids": True}).choices[0]
    tokens = [int(t.token.removeprefix("token_id:")) for t in reply.logprobs.content]
    print(json.dumps({"text": reply.message.content, "finish_reason": reply.finish_reason,
                      "tokens": tokens}), flush=True)


def status(url: str) -> int | None:
    import httpx
    try:
        return httpx.get(url + "/health", timeout=1.0).status_code
    except httpx.HTTPError:
        return None


if __name__ == "__main__":
    if sys.argv[1] in ("probe", "chat"):
        {"probe": probe, "chat": chat}[sys.argv[1]](**json.loads(sys.argv[2]))
    else:
        main(sys.argv[1], json.loads(sys.argv[2]))
