"""`minivllm serve` on SmolLM2 where the text matters: stop strings cut the streamed text exactly
where they cut the whole one, for completions and chat.

One server serves the module. Each case first generates greedily without a stop string, then
picks stop strings from that text: several tokens long, and starting at non-ASCII characters
(byte-level BPE often splits those across tokens).
"""

from __future__ import annotations

import asyncio

import openai
import pytest

from minivllm.entrypoints.openai.server_process import ServerProcess

MAX_TOKENS = 16
# SmolLM2 answers these with accents and emoji (greedy): characters of 2 and 4 bytes
PROMPTS = ["The capital of France is", "Le café est", "Emoji list: 🍎 apple, 🍌 banana, 🍒 cherry,"]
LONG_STOP = "a stop string that never appears"  # a long hold-back that never matches


@pytest.fixture(scope="module")
def server():
    with ServerProcess(["--served-model-name", "smol"]) as proc:
        yield proc


def stop_strings(text: str) -> list[str]:
    """Stops of 2-12 characters at a few offsets, plus one at each non-ASCII character."""
    stops = {text[i:i + n] for i in range(1, len(text), max(1, len(text) // 4))
             for n in (2, 12)}
    stops |= {text[i:i + 3] for i, ch in enumerate(text) if ord(ch) > 127}
    return sorted(s for s in stops if s.strip())


async def completion(client: openai.AsyncOpenAI, prompt: str, stop: list[str] | None,
                     stream: bool) -> str:
    kwargs = dict(model="smol", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, stop=stop)
    if not stream:
        return (await client.completions.create(**kwargs)).choices[0].text
    return "".join([c.choices[0].text async for c in
                    await client.completions.create(**kwargs, stream=True)])


async def chat(client: openai.AsyncOpenAI, prompt: str, stop: list[str] | None,
               stream: bool) -> str:
    kwargs = dict(model="smol", messages=[{"role": "user", "content": prompt}],
                  max_tokens=MAX_TOKENS, temperature=0, stop=stop)
    if not stream:
        return (await client.chat.completions.create(**kwargs)).choices[0].message.content
    return "".join([c.choices[0].delta.content or "" async for c in
                    await client.chat.completions.create(**kwargs, stream=True) if c.choices])


@pytest.mark.parametrize("create", [completion, chat])
def test_streamed_and_whole_text_agree_with_stop_strings(server, create):
    async def main() -> tuple[int, int]:
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
        try:
            texts = await asyncio.gather(*(create(client, p, None, False) for p in PROMPTS))
            cases = [(p, [stop, LONG_STOP]) for p, text in zip(PROMPTS, texts)
                     for stop in stop_strings(text)]
            whole = await asyncio.gather(*(create(client, p, s, False) for p, s in cases))
            streamed = await asyncio.gather(*(create(client, p, s, True) for p, s in cases))
        finally:
            await client.close()
        for (p, (stop, _)), w, s in zip(cases, whole, streamed):
            assert s == w, f"{p!r} stop {stop!r}: streamed {s!r}, whole {w!r}"
            assert stop not in w
        return len(cases), sum(any(ord(c) > 127 for c in s[0]) for _, s in cases)
    num_cases, non_ascii = asyncio.run(main())
    assert num_cases >= 20 and non_ascii >= 2, (num_cases, non_ascii)
