"""The executor interface the engine core talks to. In vLLM: vllm/v1/executor/abstract.py:53."""

from __future__ import annotations

from abc import ABC, abstractmethod

from minivllm.engine.config import EngineConfig
from minivllm.engine.scheduler_output import ModelRunnerOutput, SchedulerOutput


class Executor(ABC):
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self._init_executor()

    @abstractmethod
    def _init_executor(self) -> None:
        """Start the workers and load the model."""

    @abstractmethod
    def initialize_kv_cache(self, num_blocks: int) -> None: ...

    @abstractmethod
    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput: ...

    @abstractmethod
    def shutdown(self) -> None: ...
