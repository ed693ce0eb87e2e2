"""Exercise 215: a scheduler output that sends deltas, and the worker that applies them to its
cached request table (see README.md). The Structs are the wire format: keep them as they are.

The first time a request is scheduled its whole state goes to the workers (NewRequestData);
after that only what changed (CachedRequestData): the output tokens and blocks the workers
have not seen, and the new num_computed_tokens. A request resumed after preemption got a new
block table, so its blocks are sent whole and replace the old ones. As in vLLM
(vllm/v1/core/sched/output.py:138, vllm/v1/worker/gpu_model_runner.py:1187).
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec


# --- the scheduler's view of a request this step (the judge's scheduler fills these) ------
class SamplingParams(msgspec.Struct, frozen=True):
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 16


class ScheduledRequest(msgspec.Struct):
    req_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    output_token_ids: list[int]  # every token sampled so far
    block_ids: list[int]  # its whole block table, after this step's allocation
    num_computed_tokens: int  # tokens in the KV cache before this step
    num_scheduled_tokens: int
    resumed: bool = False  # preempted since it was last scheduled


# --- the wire ----------------------------------------------------------------------------
class NewRequestData(msgspec.Struct):
    req_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    block_ids: list[int]
    num_computed_tokens: int


class CachedRequestData(msgspec.Struct):
    req_ids: list[str] = []
    resumed_req_ids: set[str] = set()  # their new_block_ids replace the block table
    new_token_ids: list[list[int]] = []  # output tokens the workers have not seen yet
    new_block_ids: list[list[int]] = []  # appended, or the whole table if resumed
    num_computed_tokens: list[int] = []


class SchedulerOutput(msgspec.Struct):
    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: dict[str, int]
    finished_req_ids: list[str]  # finished (or aborted) since the last output


def encode(out: SchedulerOutput) -> bytes:
    raise NotImplementedError("TODO: msgspec.msgpack")


def decode(data: bytes) -> SchedulerOutput:
    """Typed decode: Structs come back as Structs; malformed bytes raise msgspec.DecodeError."""
    raise NotImplementedError("TODO: a msgspec.msgpack.Decoder for SchedulerOutput")


# --- the scheduler side --------------------------------------------------------------------
class DeltaEncoder:
    """Remembers what the workers know of each request, and sends only the difference."""

    def __init__(self):
        raise NotImplementedError("TODO: what have the workers been sent, per request?")

    def make_output(self, scheduled: list[ScheduledRequest],
                    finished: list[str]) -> SchedulerOutput:
        raise NotImplementedError("TODO: new requests whole, known ones as deltas; forward "
                                  "and forget the finished ids")

    def num_tracked(self) -> int:
        """How many requests the encoder remembers (finished ones must be forgotten)."""
        raise NotImplementedError("TODO")


# --- the worker side ------------------------------------------------------------------------
@dataclass
class CachedRequestState:
    req_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    output_token_ids: list[int]
    block_ids: list[int]
    num_computed_tokens: int


class WorkerState:
    """The worker's cached request table, kept in step with the scheduler by its outputs."""

    def __init__(self):
        self.requests: dict[str, CachedRequestState] = {}

    def update(self, out: SchedulerOutput) -> None:
        raise NotImplementedError("TODO: drop finished ids, add new requests, apply deltas")
