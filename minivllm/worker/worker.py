"""A Worker owns one device's share of the model: the ModelRunner and its KV cache.

With one worker it is an object inside the engine core process (UniProcExecutor); with tensor
parallelism each worker will live in its own process (WorkerProc) and receive the same
SchedulerOutput by broadcast. In vLLM: vllm/v1/worker/gpu_worker.py:197.
"""

from __future__ import annotations

import torch

from minivllm.engine.config import EngineConfig
from minivllm.engine.scheduler_output import ModelRunnerOutput, SchedulerOutput
from minivllm.worker.model_runner import ModelRunner


class Worker:
    def __init__(self, config: EngineConfig, rank: int = 0) -> None:
        self.config, self.rank = config, rank
        self.model_runner = ModelRunner(config)

    def init_device(self) -> None:
        if self.config.num_threads:
            torch.set_num_threads(self.config.num_threads)

    def load_model(self) -> None:
        self.model_runner.load_model()

    def initialize_kv_cache(self, num_blocks: int) -> None:
        self.model_runner.initialize_kv_cache(num_blocks)

    @torch.inference_mode()
    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        return self.model_runner.execute_model(scheduler_output)

    def shutdown(self) -> None:
        self.model_runner.kv_caches = []
        self.model_runner.model = None
