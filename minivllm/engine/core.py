"""EngineCore: the scheduler and the executor, stepped in a loop.

This is the in-process core: the caller adds `EngineCoreRequest`s and calls `step()`, which
returns `EngineCoreOutputs`. `EngineCoreProc` (engine/core_proc.py) runs the same object in its
own process behind ZMQ sockets. In vLLM: EngineCore (and its step) in vllm/v1/engine/core.py.
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np

from minivllm.engine.config import EngineConfig
from minivllm.engine.messages import EngineCoreOutputs, EngineCoreRequest
from minivllm.engine.request import Request, RequestStatus
from minivllm.engine.scheduler import Scheduler
from minivllm.executor.abstract import Executor
from minivllm.sampling_params import SamplingParams
from minivllm.utils import tracing

# The methods a client may call by name with call_utility (vLLM looks any method up with
# getattr in EngineCoreProc._handle_client_request; a list keeps the socket from reaching shutdown or private helpers).
UTILITY_METHODS = frozenset({"reset_prefix_cache", "get_stats", "collective_rpc", "echo"})


def validate_request(config: EngineConfig, request_id: str, prompt_token_ids: np.ndarray) -> None:
    """Raise ValueError, saying what to change, for a prompt the engine cannot run. The front
    ends call it before sending; the engine core calls it again, for clients that did not."""
    ids = prompt_token_ids
    n = len(ids) if ids.ndim == 1 else -1
    if not 0 < n < config.max_model_len:
        raise ValueError(f"request {request_id}: the prompt has {n} tokens, the model takes 1 "
                         f"to {config.max_model_len - 1}; shorten it" if n >= 0 else
                         f"request {request_id}: token ids must be a flat list, got shape "
                         f"{ids.shape}")
    if ids.dtype.kind not in "iu":
        raise ValueError(f"request {request_id}: token ids must be integers, got {ids.dtype}")
    vocab = config.model_config.vocab_size
    if int(ids.max()) >= vocab or int(ids.min()) < 0:
        raise ValueError(f"request {request_id}: token ids must be in [0, {vocab})")


def normalize_sampling_params(params: SamplingParams, vocab: int) -> SamplingParams:
    """The request's sampling settings in the ranges the step's arrays carry, or ValueError
    naming the field: a request's data must never fail a step that other requests share.
    top_k at or above the vocabulary means "no top-k", as vLLM clamps it
    (vllm/v1/worker/gpu_input_batch.py:407-412); logprobs past the vocabulary and logit_bias
    ids outside it are refused (vllm/sampling_params.py:923-934, 1075-1091). Stop token ids
    outside the vocabulary can never be sampled, so they are dropped."""
    for name in ("logprobs", "prompt_logprobs"):
        num = getattr(params, name)
        if num is not None and num > vocab:
            raise ValueError(f"{name}={num} is more than the vocabulary's {vocab} tokens")
    bad = sorted(t for t in params.logit_bias or {} if not 0 <= t < vocab)
    if bad:
        raise ValueError(f"token id(s) {bad[:5]} in logit_bias are outside the vocabulary "
                         f"[0, {vocab})")
    top_k = 0 if params.top_k >= vocab else params.top_k
    stops = [t for t in params.stop_token_ids if 0 <= t < vocab]
    if top_k == params.top_k and stops == params.stop_token_ids:
        return params
    return msgspec.structs.replace(params, top_k=top_k, stop_token_ids=stops)


class EngineCore:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.model_executor = Executor.get_class(config)(config)
        self.model_executor.initialize_kv_cache(config.num_kv_blocks)
        self.scheduler = Scheduler(config.scheduler_config)

    def add_request(self, request: EngineCoreRequest) -> None:
        if request.request_id in self.scheduler.requests:
            raise ValueError(f"request id {request.request_id!r} is already running")
        validate_request(self.config, request.request_id, request.prompt_token_ids)
        request.sampling_params = normalize_sampling_params(
            request.sampling_params, self.config.model_config.vocab_size)
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
        with tracing.span("schedule"):
            scheduler_output = self.scheduler.schedule()
        if not scheduler_output.req_ids:
            return EngineCoreOutputs()
        with tracing.span("execute_model"):
            model_output = self.model_executor.execute_model(scheduler_output)
        self.process_aborts_during_step()
        with tracing.span("update_from_output"):
            return self.scheduler.update_from_output(scheduler_output, model_output)

    def process_aborts_during_step(self) -> None:
        """Hook between execute and update_from_output: EngineCoreProc applies the aborts that
        arrived during the forward pass here, so no token of an aborted request is emitted."""

    # --- utilities: what a client may call by name (UtilityRequest) ----------------------
    def reset_prefix_cache(self) -> None:
        self.scheduler.kv_cache_manager.reset_prefix_cache()

    def get_stats(self) -> dict[str, Any]:
        kv = self.scheduler.kv_cache_manager
        total = len(kv.blocks)
        return {"num_running": len(self.scheduler.running),
                "num_waiting": len(self.scheduler.waiting),
                "kv_blocks_used": total - kv.num_free_blocks, "kv_blocks_total": total,
                "num_preemptions": self.scheduler.num_preemptions}

    def collective_rpc(self, method: str, args: tuple | list = (), kwargs: dict | None = None,
                       timeout: float | None = None) -> list:
        """Call `method` on every worker (the executor's collective_rpc, added with TP)."""
        return self.model_executor.collective_rpc(method, tuple(args), kwargs, timeout)

    def echo(self, value: Any) -> Any:
        """Return the argument: a round trip through the engine's queues, for tests and taps."""
        return value

    def call_utility(self, method: str, args: list) -> Any:
        if method not in UTILITY_METHODS:
            raise ValueError(f"unknown utility {method!r}; choose one of "
                             f"{', '.join(sorted(UTILITY_METHODS))}")
        return getattr(self, method)(*args)

    def shutdown(self) -> None:
        self.model_executor.shutdown()
