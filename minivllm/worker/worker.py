"""A Worker owns one device's share of the model: the ModelRunner and its KV cache.

With one worker it is an object inside the engine core process (UniProcExecutor); with the
"mp" executor each worker lives in its own process (WorkerProc, worker_proc.py), receives the
same SchedulerOutput by broadcast, and holds 1 / N of every layer (tensor parallelism).
Every public method here can be called on all workers at once with
`executor.collective_rpc(name, args)`. In vLLM: vllm/v1/worker/gpu_worker.py (Worker).
"""

from __future__ import annotations

import os
import time

import numpy as np
import torch

from minivllm.distributed import parallel_state
from minivllm.engine.config import EngineConfig
from minivllm.engine.scheduler_output import ModelRunnerOutput, SchedulerOutput
from minivllm.model.sampler import compute_logprobs
from minivllm.utils.heap import trim_heap
from minivllm.worker.model_runner import ModelRunner


def default_num_threads(world_size: int) -> int | None:
    """torch threads per worker: the cores this process may use, shared by this node's ranks
    (3 ranks on 2 cores get one each: more threads than cores make the ranks fight for them)."""
    if world_size == 1:
        return None  # torch's default: every core
    return max(1, len(os.sched_getaffinity(0)) // world_size)


class Worker:
    def __init__(self, config: EngineConfig, rank: int = 0,
                 distributed_init_method: str | None = None) -> None:
        self.config, self.rank = config, rank
        self.distributed_init_method = distributed_init_method
        self.model_runner = ModelRunner(config)

    def init_device(self) -> None:
        world = self.config.tensor_parallel_size
        threads = self.config.num_threads or default_num_threads(self.config.local_world_size)
        if threads:
            torch.set_num_threads(threads)
        if world > 1 and parallel_state.get_tp_group().world_size == 1:
            self.init_distributed()

    def init_distributed(self, local_ip: str | None = None) -> None:
        """Join the TP group (across nodes, before the queues: multinode.py)."""
        parallel_state.init_distributed_environment(
            self.rank, self.config.tensor_parallel_size, self.distributed_init_method,
            local_ip=local_ip, timeout_s=self.config.collective_timeout_s)

    def load_model(self) -> None:
        self.model_runner.load_model()
        trim_heap()  # the load's freed buffers out of this process's RSS

    def initialize_kv_cache(self, num_blocks: int) -> None:
        self.model_runner.initialize_kv_cache(num_blocks)

    @torch.inference_mode()
    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        return self.model_runner.execute_model(scheduler_output)

    def score(self, token_ids: list[int]) -> np.ndarray | None:
        """Logits (n, vocab) at every position of one sequence (on the output rank; None on
        the others): what tests compare across tensor-parallel sizes."""
        logits = self.model_runner.model.score(token_ids, self.config.block_size)
        return None if logits is None else logits.numpy()

    @torch.inference_mode()
    def prompt_logprobs(self, token_ids: list[int], num: int) -> list | None:
        """Each prompt token's (ids, logprobs, rank) given the tokens before it, None for the
        first, from one unchunked pass over the prompt (on the output rank; None on the
        others). Requests get theirs chunk by chunk during the prefill
        (SamplingParams.prompt_logprobs, ModelRunner._prompt_logprobs); this whole-prompt pass
        is the reference the tests hold that path to."""
        logits = self.model_runner.model.score(token_ids, self.config.block_size)
        if logits is None:
            return None
        ids, lps, ranks = compute_logprobs(logits[:-1], torch.tensor(token_ids[1:]), num)
        return [None, *zip(ids.tolist(), lps.tolist(), ranks.tolist())]

    def get_num_threads(self) -> int:
        return torch.get_num_threads()

    def perf_counter(self) -> float:
        """This worker's clock now (CLOCK_MONOTONIC, shared by every process on the machine):
        called by broadcast, it tells when each rank read the call."""
        return time.perf_counter()

    def measure_all_reduce(self, numel: int, repeats: int = 20) -> float:
        """Median seconds of one all-reduce of `numel` float32s across the ranks (0 at TP=1)."""
        tp = parallel_state.get_tp_group()
        x, times = torch.ones(numel), []
        for _ in range(repeats):
            start = time.perf_counter()
            tp.all_reduce(x)
            times.append(time.perf_counter() - start)
        return float(np.median(times))

    def shutdown(self) -> None:
        self.model_runner.kv_caches = []
        self.model_runner.model = None
        parallel_state.destroy_distributed_environment()
