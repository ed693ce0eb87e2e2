"""One worker, in the engine core's own process: every call is a method call.
In vLLM: UniProcExecutor in vllm/v1/executor/uniproc_executor.py (and its collective_rpc)."""

from __future__ import annotations

from typing import Any

from minivllm.engine.scheduler_output import ModelRunnerOutput, SchedulerOutput
from minivllm.executor.abstract import Executor
from minivllm.worker.worker import Worker


class UniProcExecutor(Executor):
    def _init_executor(self) -> None:
        self.driver_worker = Worker(self.config, rank=0)
        self.driver_worker.init_device()
        self.driver_worker.load_model()

    def collective_rpc(self, method: str, args: tuple = (), kwargs: dict | None = None,
                       timeout: float | None = None, unique_reply_rank: int | None = None
                       ) -> list[Any]:
        """The one worker's result in a list; timeout is ignored (a method call cannot be
        abandoned halfway)."""
        if method.startswith("_") or not callable(getattr(self.driver_worker, method, None)):
            raise AttributeError(f"Worker has no public method {method!r}")
        return [getattr(self.driver_worker, method)(*args, **(kwargs or {}))]

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        return self.driver_worker.execute_model(scheduler_output)

    def shutdown(self) -> None:
        self.driver_worker.shutdown()
