"""Continuous batching: which requests run this step, and how many tokens each.

There is no prefill phase and decode phase, only a token budget per step (as in vLLM V1):
running requests go first, one token each for a decode or the next chunk of a long prompt
(chunked prefill); waiting requests fill what is left of the budget. When the KV cache runs out
of blocks, the most recently admitted running request is preempted: its blocks are freed and it
goes back to the front of the waiting queue, to be recomputed later (prefix caching usually
gives most of it back). In vLLM: Scheduler's schedule, _preempt_request and
update_from_output in vllm/v1/core/sched/scheduler.py; check_stop in vllm/v1/core/sched/utils.py.

Two caps shorten prompt chunks, so that a step carrying prompts does not stall the streams that
decode in it: long_prefill_token_threshold (vLLM's: one request's chunk, only when another
request is eligible) and target_itl_ms (minivllm's: every prompt token of the step together,
sized from the measured cost of past steps, step_cost.py, so the step's predicted time stays
within the target, its rows filling the GEMM's padding; never below that padding, or one KV
block where the decodes leave none, so prompts always progress). A target below
what the running decodes alone take cannot be met: prompts then move that much a step, first
tokens wait and fewer streams decode a step, so throughput falls (scripts/side_by_side_steps.py
measures the trade against a smaller max_num_batched_tokens).
"""

from __future__ import annotations

import time
from collections import deque

import numpy as np

from minivllm.engine.config import SchedulerConfig
from minivllm.engine.kv_cache_manager import KVCacheManager
from minivllm.engine.messages import EngineCoreOutput, EngineCoreOutputs, FinishReason
from minivllm.engine.request import Request, RequestStatus
from minivllm.engine.sampling_extras import pack_prompt_logprobs_wanted, pack_sampling_extras
from minivllm.engine.scheduler_output import ModelRunnerOutput, SchedulerOutput
from minivllm.engine.step_cost import StepCostModel
from minivllm.utils import tracing


class Scheduler:
    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.kv_cache_manager = KVCacheManager(config.num_kv_blocks, config.block_size,
                                               config.enable_prefix_caching)
        self.requests: dict[str, Request] = {}
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.finished_req_ids: list[str] = []
        self.num_preemptions = 0
        self.step_cost = StepCostModel(row_multiple(config))
        self._step_start: float | None = None  # the last step's schedule(), if still timed
        self._step_shape = (0, 0)  # its (decodes, prefill tokens)
        self._prefill_left = 0  # prompt tokens this step may still take

    def add_request(self, request: Request) -> None:
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        self._time_last_step()
        budget = self.config.max_num_batched_tokens
        self._prefill_left = self._prefill_cap(budget)
        scheduled, budget, preempted = self._schedule_running(budget)
        if not preempted:  # a step that had to preempt admits nobody new
            scheduled += self._schedule_waiting(budget)
        output = self._make_output(scheduled)
        for request, num_new in scheduled:  # the tokens are in flight: count them as computed
            request.num_computed_tokens += num_new
        prefill = [n for _, n in scheduled if n > 1]
        self._step_shape = (len(scheduled) - len(prefill), sum(prefill))
        if not scheduled:  # the engine may now wait: the next step's time is not this one's
            self._step_start = None
        if tracing.enabled():  # the step's shape, read next to its execute_model span
            now = time.perf_counter_ns()
            tracing.complete("step_tokens", now, now, {"decodes": self._step_shape[0],
                                                       "prefill_tokens": self._step_shape[1]})
        return output

    def _time_last_step(self) -> None:
        """One sample for the cost model: from the last schedule() to this one, when the
        engine went straight on (see update_from_output). Includes everything a stream waits
        for between two tokens: the model, the scheduler, the outputs' handling. Only under
        target_itl_ms, the fit's one reader: otherwise no step pays for a least-squares fit."""
        if self.config.target_itl_ms is None:
            return
        now = time.perf_counter()
        if self._step_start is not None:
            self.step_cost.observe(*self._step_shape, now - self._step_start)
        self._step_start = now

    def _prefill_cap(self, budget: int) -> int:
        """Prompt tokens this step may carry: the budget, or under target_itl_ms what the
        running decodes leave of the target (at least the padding they leave, else a block)."""
        target = self.config.target_itl_ms
        if target is None:
            return budget
        decodes = sum(1 for r in self.running if r.num_tokens - r.num_computed_tokens == 1)
        if decodes == 0:  # no stream is waiting on this step
            return budget
        cap = self.step_cost.prefill_budget(decodes, target / 1e3)
        floor = self.step_cost.free_rows(decodes) or self.config.block_size
        return budget if cap is None else max(cap, floor)

    def _chunk(self, remaining: int, budget: int, eligible: int) -> int:
        """The tokens a request with `remaining` uncomputed tokens gets; a decode is never
        capped (vLLM caps with long_prefill_token_threshold only when eligible > 1)."""
        num_new = min(remaining, budget)
        if remaining == 1 or not self.config.enable_chunked_prefill:
            return num_new
        threshold = self.config.long_prefill_token_threshold
        if 0 < threshold and eligible > 1:
            num_new = min(num_new, threshold)
        return min(num_new, self._prefill_left)

    def _took_prefill(self, num_new: int) -> None:
        if num_new > 1:
            self._prefill_left -= num_new

    def _schedule_running(self, budget: int) -> tuple[list[tuple[Request, int]], int, bool]:
        """Decodes and prompt chunks of running requests, oldest first. Returns (scheduled,
        budget left, whether anyone was preempted)."""
        scheduled: list[tuple[Request, int]] = []
        preempted, i = False, 0
        eligible = len(self.running) + len(self.waiting)
        while i < len(self.running) and budget > 0:
            request = self.running[i]
            num_new = self._chunk(request.num_tokens - request.num_computed_tokens, budget,
                                  eligible)
            if num_new == 0:  # a prompt chunk, and the step's prompt tokens are spent
                i += 1
                continue
            fits, evicted = self._make_room(request, num_new)
            preempted |= evicted
            if not fits:  # it preempted itself; the ones after it are gone too
                break
            scheduled.append((request, num_new))
            self._took_prefill(num_new)
            budget -= num_new
            i += 1
        return scheduled, budget, preempted

    def _make_room(self, request: Request, num_new: int) -> tuple[bool, bool]:
        """Allocate num_new slots for a running request, preempting the newest running ones
        until they fit. Returns (the request fits, someone was preempted)."""
        preempted = False
        while not self.kv_cache_manager.allocate_slots(request, num_new):
            victim = self.running.pop()  # the latest admitted goes back to waiting
            self._preempt(victim)
            preempted = True
            if victim is request:
                return False, True
        return True, preempted

    def _schedule_waiting(self, budget: int) -> list[tuple[Request, int]]:
        """Admit waiting requests, in order, while the budget, max_num_seqs and the cache allow."""
        scheduled: list[tuple[Request, int]] = []
        eligible = len(self.running) + len(self.waiting)
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            request = self.waiting[0]
            hits = self.kv_cache_manager.get_computed_blocks(request)
            num_hit = len(hits) * self.config.block_size
            num_new = request.num_tokens - num_hit
            if num_new > budget and not self.config.enable_chunked_prefill:
                break
            num_new = self._chunk(num_new, budget, eligible)
            if num_new == 0:  # the step's prompt tokens are spent
                break
            if not self.kv_cache_manager.allocate_slots(request, num_new, hits):
                break
            self.waiting.popleft()
            self.running.append(request)
            request.status = RequestStatus.RUNNING
            request.num_computed_tokens = num_hit
            if request.num_cached_tokens is None:  # the first admission counts, not a re-run
                request.num_cached_tokens = num_hit
            scheduled.append((request, num_new))
            self._took_prefill(num_new)
            budget -= num_new
        return scheduled

    def _preempt(self, request: Request) -> None:
        self.kv_cache_manager.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        self.waiting.appendleft(request)
        self.num_preemptions += 1

    def _make_output(self, scheduled: list[tuple[Request, int]]) -> SchedulerOutput:
        """The step as arrays for the workers; reads the requests, changes nothing."""
        kv = self.kv_cache_manager
        tables = [kv.get_block_ids(r.request_id) for r, _ in scheduled]
        block_tables = np.zeros((len(scheduled), max(map(len, tables), default=0)), np.int32)
        for row, table in zip(block_tables, tables):
            row[:len(table)] = table
        params = [r.sampling_params for r, _ in scheduled]
        computed = np.array([r.num_computed_tokens for r, _ in scheduled], np.int32)
        num_new = np.array([n for _, n in scheduled], np.int32)
        starts = computed.tolist()
        tokens = [r.all_token_ids[c:c + n] for (r, n), c in zip(scheduled, starts)]
        sample_rows = np.array([c + n == r.num_tokens for (r, n), c in zip(scheduled, starts)],
                               bool)
        out = SchedulerOutput(
            req_ids=[r.request_id for r, _ in scheduled],
            num_scheduled_tokens=num_new, num_computed_tokens=computed,
            input_token_ids=np.fromiter((t for ts in tokens for t in ts), np.int32, int(num_new.sum())),
            block_tables=block_tables,
            sample_rows=sample_rows,
            temperature=np.array([p.temperature for p in params], np.float32),
            top_p=np.array([p.top_p for p in params], np.float32),
            top_k=np.array([max(p.top_k, 0) for p in params], np.int32),
            seeds=np.array([-1 if p.seed is None else p.seed for p in params], np.int64),
            num_output_tokens=np.array([r.num_output_tokens for r, _ in scheduled], np.int32),
            finished_req_ids=self.finished_req_ids,
            num_logprobs=np.array([-1 if p.logprobs is None else p.logprobs for p in params],
                                  np.int32),
            sampling_extras=pack_sampling_extras([r for r, _ in scheduled], sample_rows),
            prompt_logprobs=pack_prompt_logprobs_wanted(scheduled, starts))
        self.finished_req_ids = []
        return out

    def update_from_output(self, scheduler_output: SchedulerOutput,
                           runner_output: ModelRunnerOutput) -> EngineCoreOutputs:
        outputs = []
        ro = runner_output
        prompt_lps = self._prompt_logprobs(scheduler_output, ro)
        outputs += self._fail_requests(ro.failed)
        for row, (req_id, token) in enumerate(zip(ro.req_ids, ro.sampled_token_ids.tolist())):
            request = self.requests.get(req_id)
            if request is None or request.is_finished:
                continue  # aborted during the step
            if token < 0:  # a prompt chunk that does not sample yet
                if req_id in prompt_lps:
                    outputs.append(EngineCoreOutput(req_id, [],
                                                    new_prompt_logprobs=prompt_lps[req_id]))
                continue
            request.append_output_token(token)
            stopped = request.check_stop(self.config.max_model_len)
            num = request.sampling_params.logprobs
            logprobs = None if num is None or ro.logprobs is None else (
                ro.logprob_token_ids[row, :1 + num].tolist(), ro.logprobs[row, :1 + num].tolist(),
                int(ro.sampled_token_ranks[row]))
            outputs.append(EngineCoreOutput(
                req_id, [token], request.status.finish_reason,
                request.stop_reason, request.num_cached_tokens or 0, new_logprobs=logprobs,
                new_prompt_logprobs=prompt_lps.get(req_id)))
            if stopped:
                self._free_request(request)
        if any(r.is_finished for r in self.running):
            self.running = [r for r in self.running if not r.is_finished]
        finished = [o.request_id for o in outputs if o.finished]
        if not self.has_unfinished_requests():  # idle next: stop timing
            self._step_start = None
        return EngineCoreOutputs(outputs=outputs, finished_requests=finished,
                                 timestamp=time.monotonic())

    def _fail_requests(self, failed: dict[str, str]) -> list[EngineCoreOutput]:
        """End the requests whose rows failed in the worker with their error; the step's
        other requests go on."""
        outputs = []
        for req_id, reason in failed.items():
            request = self.requests.get(req_id)
            if request is None or request.is_finished:
                continue
            request.status = RequestStatus.FINISHED_ABORTED
            self._free_request(request)
            outputs.append(EngineCoreOutput(req_id, [], FinishReason.ERROR, error=reason))
        return outputs

    def _prompt_logprobs(self, so: SchedulerOutput, ro: ModelRunnerOutput) -> dict[str, tuple]:
        """request id -> (token ids, logprobs, ranks) of the prompt positions scored this step."""
        wanted, got = so.prompt_logprobs, ro.prompt_logprobs
        if wanted is None or got is None:
            return {}
        out = {}
        for i, row in enumerate(wanted.rows.tolist()):
            a, b, num = int(wanted.offsets[i]), int(wanted.offsets[i + 1]), int(wanted.num[i])
            request = self.requests.get(so.req_ids[row])
            if request is not None:
                request.num_prompt_logprobs_done += b - a
                out[request.request_id] = (got.token_ids[a:b, :1 + num].tolist(),
                                           got.logprobs[a:b, :1 + num].tolist(),
                                           got.ranks[a:b].tolist())
        return out

    def finish_requests(self, request_ids: list[str], status: RequestStatus) -> None:
        """Abort (or stop from outside, e.g. on a stop string): free the blocks at once."""
        for req_id in request_ids:
            request = self.requests.get(req_id)
            if request is None or request.is_finished:
                continue
            if request in self.waiting:
                self.waiting.remove(request)
            elif request in self.running:
                self.running.remove(request)
            request.status = status
            self._free_request(request)

    def _free_request(self, request: Request) -> None:
        self.kv_cache_manager.free(request)
        self.finished_req_ids.append(request.request_id)
        del self.requests[request.request_id]


def row_multiple(config: SchedulerConfig) -> int:
    """The rows the model's GEMM pads a step to, where target_itl_ms needs it (else 1)."""
    if config.target_itl_ms is None:
        return 1
    from minivllm.model.custom_ops import gemm_row_multiple  # builds or loads the C ops
    return gemm_row_multiple()
