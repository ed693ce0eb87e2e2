"""The leader's side of tests/test_multinode_netns.py, run as a process on a namespace host:

    python tests/multinode_driver.py generate '{"tensor_parallel_size": 3, ...}'
    python tests/multinode_driver.py until_dead '{...}'

generate: greedy tokens of the chat prompt, as one JSON line. until_dead: prints "generating",
then generates until the engine dies; prints the time EngineDeadError was raised (time.time():
one clock for every namespace of the machine) and its message, as one JSON line.
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


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]))
