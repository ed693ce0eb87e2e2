"""The leader's side of tests/test_multinode_netns.py, run as a process on a namespace host:

    python tests/multinode_driver.py generate '{"tensor_parallel_size": 3, ...}'
    python tests/multinode_driver.py until_dead '{...}'

    python tests/multinode_driver.py probe '{"url": "http://10.77.0.1:8000"}'

generate: greedy tokens of the chat prompt, as one JSON line. until_dead: prints "generating",
then generates until the engine dies; prints the time EngineDeadError was raised (time.time():
one clock for every namespace of the machine) and its message, as one JSON line. probe (an
HTTP client on some host): waits for /health, starts a long stream, prints "streaming", then
polls /health until it answers 503 or stops answering; prints the statuses and when the 503
came, as one JSON line.
"""

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
        if mode == "generate":
            params = SamplingParams(temperature=0.0, max_tokens=8)
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


def status(url: str) -> int | None:
    import httpx
    try:
        return httpx.get(url + "/health", timeout=1.0).status_code
    except httpx.HTTPError:
        return None


if __name__ == "__main__":
    if sys.argv[1] == "probe":
        probe(**json.loads(sys.argv[2]))
    else:
        main(sys.argv[1], json.loads(sys.argv[2]))
