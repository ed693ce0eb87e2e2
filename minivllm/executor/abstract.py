"""The executor interface the engine core talks to. In vLLM: Executor in
vllm/v1/executor/abstract.py (get_class, register_failure_callback, collective_rpc)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Callable

from minivllm.engine.config import EngineConfig
from minivllm.engine.scheduler_output import ModelRunnerOutput, SchedulerOutput

FailureCallback = Callable[[], None]


class Executor(ABC):
    @staticmethod
    def get_class(config: EngineConfig) -> type["Executor"]:
        """UniProcExecutor (the worker inside this process), MultiprocExecutor (worker
        processes behind a MessageQueue) or RayExecutor (the same, the workers as Ray
        actors), from config.distributed_executor_backend."""
        if config.distributed_executor_backend == "ray":
            from minivllm.executor.ray_executor import RayExecutor
            return RayExecutor
        if config.distributed_executor_backend == "mp":
            from minivllm.executor.multiproc_executor import MultiprocExecutor
            return MultiprocExecutor
        from minivllm.executor.uniproc_executor import UniProcExecutor
        return UniProcExecutor

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self._init_executor()

    @abstractmethod
    def _init_executor(self) -> None:
        """Start the workers and load the model."""

    @abstractmethod
    def collective_rpc(self, method: str, args: tuple = (), kwargs: dict | None = None,
                       timeout: float | None = None, unique_reply_rank: int | None = None
                       ) -> list[Any]:
        """worker.<method>(*args, **kwargs) on every worker; their results, by rank (only
        unique_reply_rank's, in a list of one, when given)."""

    def register_failure_callback(self, callback: FailureCallback) -> None:
        """callback() runs once, from another thread, if a worker dies. A worker inside the
        engine core's own process cannot die alone: by default nothing is registered."""

    def initialize_kv_cache(self, num_blocks: int) -> None:
        self.collective_rpc("initialize_kv_cache", (num_blocks,))

    @abstractmethod
    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput: ...

    @abstractmethod
    def shutdown(self) -> None: ...
