"""Fuzz a real `minivllm serve` for longer than the suite does (tests/test_server_fuzz.py):

    .venv/bin/python scripts/fuzz_server.py --examples 2000            # the tiny test model
    .venv/bin/python scripts/fuzz_server.py --model bundled --examples 300
    .venv/bin/python scripts/fuzz_server.py --url http://127.0.0.1:8000  # a server you run

Every answer must be 200 or an OpenAI-style 4xx; the server must stay healthy and a greedy
reference request must return the same text at the end as at the start. Prints how the answers
split (status, and the param each 400 named) and stops at the first bad answer.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile

import httpx
from hypothesis import HealthCheck, Phase, given, settings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

from server_fuzz_requests import (chat_bodies, check_answer, completion_bodies,  # noqa: E402
                                  encode)

from minivllm.entrypoints.openai.server_process import ServerProcess  # noqa: E402

REQUEST_TIMEOUT_S = 60.0  # the longest an answer may take (the context is 256 tokens)
REFERENCE = {"prompt": "The capital of France", "max_tokens": 12, "temperature": 0,
             "ignore_eos": True}


def reference_text(url: str) -> str:
    r = httpx.post(url + "/v1/completions", json=REFERENCE, timeout=120)
    r.raise_for_status()
    return r.json()["choices"][0]["text"]


def fuzz(url: str, examples: int) -> collections.Counter:
    seen: collections.Counter = collections.Counter()
    for path, strategy in (("/v1/completions", completion_bodies()),
                           ("/v1/chat/completions", chat_bodies())):
        run_one(url, path, strategy, examples, seen)
    return seen


def run_one(url: str, path: str, strategy, examples: int, seen: collections.Counter) -> None:
    @settings(max_examples=examples, deadline=None, database=None,
              suppress_health_check=list(HealthCheck),
              phases=[Phase.explicit, Phase.generate])  # no shrinking: a hang costs a timeout
    @given(strategy)
    def run(body):
        try:
            r = httpx.post(url + path, content=encode(body), timeout=REQUEST_TIMEOUT_S,
                           headers={"Content-Type": "application/json"})
        except httpx.TimeoutException:
            raise AssertionError(f"no answer within {REQUEST_TIMEOUT_S:g} s\nrequest: "
                                 f"{encode(body)[:800]!r}") from None
        problem = check_answer(r.status_code, r.headers, r.content, body)
        if problem:
            raise AssertionError(f"{problem}\nrequest: {encode(body)[:800]!r}")
        param = json.loads(r.content)["error"]["param"] if r.status_code != 200 else ""
        seen[f"{path} {r.status_code} {param or ''}".strip()] += 1
    run()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--examples", type=int, default=500, help="per endpoint")
    p.add_argument("--model", default="tiny", help="tiny (default), bundled, or a path")
    p.add_argument("--url", default=None, help="fuzz this running server instead")
    args = p.parse_args()
    if args.url:
        return report(args.url, args.examples, None)
    with tempfile.TemporaryDirectory(prefix="minivllm-fuzz-") as tmp:
        model = args.model
        if model == "tiny":
            from tiny_model import make_tiny_model_dir
            model = make_tiny_model_dir(tmp)
        serve_args = ([] if model == "bundled" else [model]) + [
            "--served-model-name", "tiny", "--max-model-len", "256"]
        with ServerProcess(serve_args) as server:
            return report(server.url, args.examples, server)


def report(url: str, examples: int, server: ServerProcess | None) -> int:
    before = reference_text(url)
    seen = fuzz(url, examples)
    for key, count in sorted(seen.items()):
        print(f"{count:6d}  {key}")
    healthy = httpx.get(url + "/health", timeout=30).status_code == 200
    same = reference_text(url) == before
    print(f"healthy: {healthy}; the reference text unchanged: {same}")
    if server is not None and "Traceback" in server.output():
        print("the server logged a traceback:\n" + server.output()[-3000:])
        return 1
    return 0 if healthy and same else 1


if __name__ == "__main__":
    sys.exit(main())
