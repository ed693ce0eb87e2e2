"""The client side of tests/test_dp_nodes_netns.py, run on a namespace host:

    python tests/dp_nodes_driver.py '{"url": "http://10.77.0.1:8000", "model": "...", "n": 64}'

Waits for /health, then opens n concurrent streaming completions through the official `openai`
client and prints one JSON line: how many streams finished (a finish_reason arrived), the
finish reasons seen, and the first error if any."""

import asyncio
import json
import sys
import time

import openai
from multinode_driver import status

HEALTH_TIMEOUT_S = 540.0  # start-up on a busy machine: minutes when several runs share 2 cores


async def one_stream(client: openai.AsyncOpenAI, model: str, i: int) -> str | None:
    stream = await client.completions.create(model=model, prompt=f"Request {i}: the capital",
                                             max_tokens=16, stream=True)
    finish = None
    async for chunk in stream:
        finish = chunk.choices[0].finish_reason or finish
    return finish


async def streams(url: str, model: str, n: int) -> dict:
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused",
                                  max_retries=0, timeout=120) as client:
        results = await asyncio.gather(*(one_stream(client, model, i) for i in range(n)),
                                       return_exceptions=True)
    errors = [repr(r) for r in results if isinstance(r, BaseException)]
    return {"finished": sum(isinstance(r, str) for r in results),
            "reasons": sorted({r for r in results if isinstance(r, str)}),
            "error": errors[0] if errors else None}


def main(url: str, model: str, n: int) -> None:
    deadline = time.monotonic() + HEALTH_TIMEOUT_S
    while status(url) != 200 and time.monotonic() < deadline:
        time.sleep(0.2)
    print(json.dumps(asyncio.run(streams(url, model, n))), flush=True)


if __name__ == "__main__":
    main(**json.loads(sys.argv[1]))
