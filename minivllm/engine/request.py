"""A request as the engine core tracks it. In vLLM: vllm/v1/request.py (Request)."""

from __future__ import annotations

import enum

import numpy as np

from minivllm.engine.kv_cache_manager import NONE_HASH, hash_block_tokens
from minivllm.engine.messages import EngineCoreRequest, FinishReason
from minivllm.sampling_params import SamplingParams


class RequestStatus(enum.IntEnum):
    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    FINISHED_STOPPED = 3
    FINISHED_LENGTH = 4
    FINISHED_ABORTED = 5

    @property
    def finish_reason(self) -> FinishReason | None:
        return {RequestStatus.FINISHED_STOPPED: FinishReason.STOP,
                RequestStatus.FINISHED_LENGTH: FinishReason.LENGTH,
                RequestStatus.FINISHED_ABORTED: FinishReason.ABORT}.get(self)


class Request:
    def __init__(self, request_id: str, prompt_token_ids: np.ndarray,
                 sampling_params: SamplingParams, eos_token_id: int | None,
                 block_size: int, arrival_time: float = 0.0) -> None:
        self.request_id = request_id
        self.sampling_params = sampling_params
        self.eos_token_id = eos_token_id
        self.arrival_time = arrival_time
        self.all_token_ids: list[int] = np.asarray(prompt_token_ids, np.int32).tolist()
        self.num_prompt_tokens = len(self.all_token_ids)
        self.num_computed_tokens = 0  # tokens whose K/V are in the cache (or scheduled to be)
        self.num_cached_tokens: int | None = None  # prefix-cache hits at first admission
        self.status = RequestStatus.WAITING
        self.stop_reason: int | None = None
        self.num_prompt_logprobs_done = 0  # prompt positions whose logprobs went out
        self.block_size = block_size
        self.block_hashes: list[bytes] = []  # chained hash of every full block of tokens
        self._update_block_hashes()

    @classmethod
    def from_engine_core_request(cls, req: EngineCoreRequest, eos_token_id: int | None,
                                 block_size: int) -> "Request":
        return cls(req.request_id, req.prompt_token_ids, req.sampling_params, eos_token_id,
                   block_size, req.arrival_time)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.all_token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.all_token_ids[self.num_prompt_tokens:]

    @property
    def is_finished(self) -> bool:
        return self.status >= RequestStatus.FINISHED_STOPPED

    def append_output_token(self, token_id: int) -> None:
        self.all_token_ids.append(token_id)
        self._update_block_hashes()

    def _update_block_hashes(self) -> None:
        bs = self.block_size
        for i in range(len(self.block_hashes), self.num_tokens // bs):
            parent = self.block_hashes[-1] if self.block_hashes else NONE_HASH
            self.block_hashes.append(hash_block_tokens(parent, self.all_token_ids[i * bs:(i + 1) * bs]))

    def check_stop(self, max_model_len: int) -> bool:
        """After a token is appended: set a finished status if the request is done."""
        params, last = self.sampling_params, self.all_token_ids[-1]
        if not params.ignore_eos and last == self.eos_token_id:
            self.status = RequestStatus.FINISHED_STOPPED
        elif last in params.stop_token_ids:
            self.status, self.stop_reason = RequestStatus.FINISHED_STOPPED, last
        elif self.num_output_tokens >= params.max_tokens or self.num_tokens >= max_model_len:
            self.status = RequestStatus.FINISHED_LENGTH
        return self.is_finished
