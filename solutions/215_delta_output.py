"""Exercise 215, reference answer: a scheduler output that sends deltas, and the worker that
applies them to its cached request table.

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
class SamplingParams(msgspec.Struct, frozen=True):  # pragma: no mutate block
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 16


class ScheduledRequest(msgspec.Struct):  # pragma: no mutate block
    req_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    output_token_ids: list[int]  # every token sampled so far
    block_ids: list[int]  # its whole block table, after this step's allocation
    num_computed_tokens: int  # tokens in the KV cache before this step
    num_scheduled_tokens: int
    resumed: bool = False  # preempted since it was last scheduled


# --- the wire ----------------------------------------------------------------------------
class NewRequestData(msgspec.Struct):  # pragma: no mutate block
    req_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    block_ids: list[int]
    num_computed_tokens: int


class CachedRequestData(msgspec.Struct):  # pragma: no mutate block
    req_ids: list[str] = []
    resumed_req_ids: set[str] = set()  # their new_block_ids replace the block table
    new_token_ids: list[list[int]] = []  # output tokens the workers have not seen yet
    new_block_ids: list[list[int]] = []  # appended, or the whole table if resumed
    num_computed_tokens: list[int] = []


class SchedulerOutput(msgspec.Struct):  # pragma: no mutate block
    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: dict[str, int]
    finished_req_ids: list[str]  # finished (or aborted) since the last output


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(SchedulerOutput)


def encode(out: SchedulerOutput) -> bytes:
    return _encoder.encode(out)


def decode(data: bytes) -> SchedulerOutput:
    """Typed decode: Structs come back as Structs; malformed bytes raise msgspec.DecodeError."""
    return _decoder.decode(data)


# --- the scheduler side --------------------------------------------------------------------
class DeltaEncoder:
    """Remembers what the workers know of each request, and sends only the difference."""

    def __init__(self):
        self.sent: dict[str, tuple[int, int]] = {}  # req_id -> (output tokens, blocks) sent

    def make_output(self, scheduled: list[ScheduledRequest],
                    finished: list[str]) -> SchedulerOutput:
        for req_id in finished:  # first: an id can finish and come back new in one step
            self.sent.pop(req_id, None)
        new, cached = [], CachedRequestData([], set(), [], [], [])
        for req in scheduled:
            known = self.sent.get(req.req_id)
            if known is None:
                new.append(NewRequestData(req.req_id, req.prompt_token_ids, req.sampling_params,
                                          list(req.block_ids), req.num_computed_tokens))
                self.sent[req.req_id] = (len(req.output_token_ids), len(req.block_ids))
                continue
            n_tokens, n_blocks = known
            if req.resumed:  # a fresh block table: send it all, the workers replace theirs
                cached.resumed_req_ids.add(req.req_id)
                n_blocks = 0
            cached.req_ids.append(req.req_id)
            cached.new_token_ids.append(req.output_token_ids[n_tokens:])
            cached.new_block_ids.append(req.block_ids[n_blocks:])
            cached.num_computed_tokens.append(req.num_computed_tokens)
            self.sent[req.req_id] = (len(req.output_token_ids), len(req.block_ids))
        return SchedulerOutput(new, cached,
                               {r.req_id: r.num_scheduled_tokens for r in scheduled},
                               list(finished))

    def num_tracked(self) -> int:
        """How many requests the encoder remembers (finished ones must be forgotten)."""
        return len(self.sent)


# --- the worker side ------------------------------------------------------------------------
@dataclass
class CachedRequestState:  # pragma: no mutate block
    req_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    output_token_ids: list[int]
    block_ids: list[int]
    num_computed_tokens: int


class WorkerState:
    """The worker's cached request table, kept in step with the scheduler by its outputs."""

    def __init__(self):  # pragma: no mutate block
        self.requests: dict[str, CachedRequestState] = {}

    def update(self, out: SchedulerOutput) -> None:
        for req_id in out.finished_req_ids:  # first; an unknown id (never scheduled) is fine
            self.requests.pop(req_id, None)
        for new in out.scheduled_new_reqs:
            self.requests[new.req_id] = CachedRequestState(
                new.req_id, list(new.prompt_token_ids), new.sampling_params, [],
                list(new.block_ids), new.num_computed_tokens)
        c = out.scheduled_cached_reqs
        for req_id, tokens, blocks, computed in zip(c.req_ids, c.new_token_ids, c.new_block_ids,
                                                    c.num_computed_tokens, strict=True):
            state = self.requests.get(req_id)
            if state is None:
                raise KeyError(f"the scheduler sent a delta for {req_id!r}, which this worker "
                               "has never seen: it must have come as a new request first")
            state.output_token_ids.extend(tokens)
            if req_id in c.resumed_req_ids:
                state.block_ids = list(blocks)
            else:
                state.block_ids.extend(blocks)
            state.num_computed_tokens = computed
