"""EngineCore: the scheduler and the executor, stepped in a loop.

This is the in-process core: the caller adds `EngineCoreRequest`s and calls `step()`, which
returns `EngineCoreOutputs`, the same messages a later chapter sends over ZMQ when the core
runs in its own process (EngineCoreProc). In vLLM: vllm/v1/engine/core.py:121 (step at :667).
"""

from __future__ import annotations

from minivllm.engine.config import EngineConfig
from minivllm.engine.messages import EngineCoreOutputs, EngineCoreRequest
from minivllm.engine.request import Request, RequestStatus
from minivllm.engine.scheduler import Scheduler
from minivllm.executor.abstract import Executor


class EngineCore:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.model_executor = Executor.get_class(config)(config)
        self.model_executor.initialize_kv_cache(config.num_kv_blocks)
        self.scheduler = Scheduler(config)

    def add_request(self, request: EngineCoreRequest) -> None:
        n = len(request.prompt_token_ids)
        if not 0 < n < self.config.max_model_len:
            raise ValueError(f"request {request.request_id}: the prompt has {n} tokens, the "
                             f"model takes 1 to {self.config.max_model_len - 1}; shorten it")
        if request.request_id in self.scheduler.requests:
            raise ValueError(f"request id {request.request_id!r} is already running")
        vocab = self.config.model_config.vocab_size
        if int(request.prompt_token_ids.max()) >= vocab or int(request.prompt_token_ids.min()) < 0:
            raise ValueError(f"request {request.request_id}: token ids must be in [0, {vocab})")
        self.scheduler.add_request(Request.from_engine_core_request(
            request, self.config.model_config.eos_token_id, self.config.block_size))

    def abort_requests(self, request_ids: list[str]) -> None:
        self.scheduler.finish_requests(request_ids, RequestStatus.FINISHED_ABORTED)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def step(self) -> EngineCoreOutputs:
        """Schedule, run the model once, and turn sampled tokens into outputs."""
        if not self.scheduler.has_unfinished_requests():
            return EngineCoreOutputs()
        scheduler_output = self.scheduler.schedule()
        if not scheduler_output.req_ids:
            return EngineCoreOutputs()
        model_output = self.model_executor.execute_model(scheduler_output)
        return self.scheduler.update_from_output(scheduler_output, model_output)

    def shutdown(self) -> None:
        self.model_executor.shutdown()
