"""One worker, in the engine core's own process: every call is a method call.
In vLLM: vllm/v1/executor/uniproc_executor.py:51."""

from __future__ import annotations

from minivllm.engine.scheduler_output import ModelRunnerOutput, SchedulerOutput
from minivllm.executor.abstract import Executor
from minivllm.worker.worker import Worker


class UniProcExecutor(Executor):
    def _init_executor(self) -> None:
        self.driver_worker = Worker(self.config, rank=0)
        self.driver_worker.init_device()
        self.driver_worker.load_model()

    def initialize_kv_cache(self, num_blocks: int) -> None:
        self.driver_worker.initialize_kv_cache(num_blocks)

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        return self.driver_worker.execute_model(scheduler_output)

    def shutdown(self) -> None:
        self.driver_worker.shutdown()
