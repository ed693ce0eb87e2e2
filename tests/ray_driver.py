"""The Ray side of tests/test_ray_backend.py, run as a process on a namespace host:

    python tests/ray_driver.py in_actor HEAD '{"model": ..., "tensor_parallel_size": 3}' [STRATEGY]

in_actor: a Ray driver (ray.init(HEAD)) that reserves one {"CPU": 1} bundle per rank, by
default on as many nodes (STRICT_SPREAD: a group minivllm would not build), and runs LLM(...)
in an actor placed in that group, as vLLM is run under a Ray job that owns its resources (vLLM
takes the actor's group: arg_utils.py:2373-2378). The actor asks for no CPU, so the bundles
are the ranks' alone. It prints one JSON line: the greedy tokens, the group's free CPUs while
the engine ran (0: its ranks held all of them), and the group's state after LLM exited
(minivllm removes only a group it made).
"""

import json
import sys

import ray
from ray.util import placement_group, placement_group_table
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from minivllm.utils.load_scale import stretched
from multinode_driver import QUESTION

PG_READY_TIMEOUT_S = 60.0


@ray.remote(num_cpus=0)
class LLMActor:
    def chat(self, question: list, engine_args: dict, pg_resource: str) -> dict:
        from minivllm.entrypoints.llm import LLM
        from minivllm.sampling_params import SamplingParams
        params = SamplingParams(temperature=0.0, max_tokens=8)
        with LLM(**engine_args) as llm:
            out = llm.chat(question, params, use_tqdm=False)[0].outputs[0]
            free = ray.available_resources().get(pg_resource, 0.0)
        return {"tokens": list(out.token_ids), "pg_free_cpus": free}

    def exit(self) -> None:
        """End the actor's process with its exit hooks (LLM's run folder goes with them;
        ray.kill would skip them)."""
        ray.actor.exit_actor()


def in_actor(head: str, engine_args: dict, strategy: str = "STRICT_SPREAD") -> None:
    ray.init(address=head, logging_level="WARNING")
    n = engine_args["tensor_parallel_size"]
    pg = placement_group([{"CPU": 1}] * n, strategy=strategy)
    ray.get(pg.ready(), timeout=stretched(PG_READY_TIMEOUT_S))  # a hang check
    in_group = PlacementGroupSchedulingStrategy(placement_group=pg,
                                                placement_group_capture_child_tasks=True)
    actor = LLMActor.options(scheduling_strategy=in_group).remote()
    # Ray names a group's whole CPU pool CPU_group_<group id>
    report = ray.get(actor.chat.remote(QUESTION, engine_args, f"CPU_group_{pg.id.hex()}"))
    report["pg_state"] = placement_group_table(pg)["state"]
    print(json.dumps(report), flush=True)
    try:
        ray.get(actor.exit.remote())
    except ray.exceptions.RayActorError:
        pass  # how a call that ends its actor returns
    ray.shutdown()


if __name__ == "__main__":
    {"in_actor": in_actor}[sys.argv[1]](sys.argv[2], json.loads(sys.argv[3]), *sys.argv[4:])
