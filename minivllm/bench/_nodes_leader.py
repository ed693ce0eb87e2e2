"""The leader of `minivllm bench nodes`' TP part, run on a namespace host (or on this one):

    python -m minivllm.bench._nodes_leader '{"tensor_parallel_size": 3, ...}' BATCH TOKENS

Decodes BATCH prompts of TOKENS tokens each (greedy, ignore_eos) once to warm up, then again
timed; prints {"tokens_per_s", "seconds", "tokens"} as one JSON line.
"""

from __future__ import annotations

import json
import sys
import time

from minivllm.entrypoints.llm import LLM
from minivllm.sampling_params import SamplingParams


def main(engine_args: dict, batch: int, tokens: int) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    prompts = [f"Tell me about the number {i}." for i in range(batch)]
    with LLM(**engine_args) as llm:
        llm.generate(prompts[:2], SamplingParams(max_tokens=4), use_tqdm=False)  # warm-up
        start = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        seconds = time.perf_counter() - start
    made = sum(len(o.outputs[0].token_ids) for o in outs)
    print(json.dumps({"tokens_per_s": made / seconds, "seconds": seconds, "tokens": made}),
          flush=True)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
