"""The leader of `minivllm bench nodes`' TP part, run on a namespace host (or on this one):

    python -m minivllm.bench._nodes_leader '{"tensor_parallel_size": 3, ...}' BATCH TOKENS [ROUNDS]

Warms up on two short prompts, then decodes BATCH prompts of TOKENS tokens each (greedy,
ignore_eos) ROUNDS times (default 1), each timed; prints {"tokens_per_s", "seconds", "tokens"}
of all rounds together and "round_tokens_per_s", each round's own, as one JSON line: the
spread of the rounds is the run's noise.
"""

from __future__ import annotations

import json
import sys
import time

from minivllm.entrypoints.llm import LLM
from minivllm.sampling_params import SamplingParams


def main(engine_args: dict, batch: int, tokens: int, rounds: int = 1) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    prompts = [f"Tell me about the number {i}." for i in range(batch)]
    timed = []  # (tokens, seconds) of each round
    with LLM(**engine_args) as llm:
        llm.generate(prompts[:2], SamplingParams(max_tokens=4), use_tqdm=False)  # warm-up
        for _ in range(rounds):
            start = time.perf_counter()
            outs = llm.generate(prompts, params, use_tqdm=False)
            seconds = time.perf_counter() - start
            timed.append((sum(len(o.outputs[0].token_ids) for o in outs), seconds))
    made, seconds = sum(t for t, _ in timed), sum(s for _, s in timed)
    print(json.dumps({"tokens_per_s": made / seconds, "seconds": seconds, "tokens": made,
                      "round_tokens_per_s": [t / s for t, s in timed]}), flush=True)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]), *map(int, sys.argv[2:5]))
