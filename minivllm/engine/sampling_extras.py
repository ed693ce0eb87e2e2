"""Pack for the workers what a few rows of a step need beyond tokens and temperature: the
penalties, logit_bias and min_tokens of sampling rows, and which prompt positions to score for
prompt logprobs. Only rows that use one of them are packed, so a step of plain requests sends
nothing extra. In vLLM the worker's InputBatch holds the same per-request state
(vllm/v1/worker/gpu_input_batch.py:413-422) and the logits processors keep theirs
(vllm/v1/sample/logits_processor/builtin.py).
"""

from __future__ import annotations

import numpy as np

from minivllm.engine.request import Request
from minivllm.engine.scheduler_output import PromptLogprobsWanted, SamplingExtras


def _needs_extras(request: Request) -> bool:
    p = request.sampling_params
    return bool(p.has_penalties or p.logit_bias or request.num_output_tokens < p.min_tokens)


def _ragged(lists: list[list], dtype) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.zeros(len(lists) + 1, np.int64)
    np.cumsum([len(x) for x in lists], out=offsets[1:])
    flat = np.fromiter((v for x in lists for v in x), dtype, int(offsets[-1]))
    return flat, offsets


def banned_until_min_tokens(request: Request) -> list[int]:
    """EOS and the stop token ids, while the request has fewer outputs than min_tokens
    (vLLM's MinTokensLogitsProcessor, vllm/v1/sample/logits_processor/builtin.py:165-205)."""
    p = request.sampling_params
    if request.num_output_tokens >= p.min_tokens:
        return []
    ids = list(p.stop_token_ids)
    if request.eos_token_id is not None and not p.ignore_eos:
        ids.append(request.eos_token_id)
    return ids


def pack_sampling_extras(requests: list[Request], sample_rows: np.ndarray) -> SamplingExtras | None:
    rows = [i for i, r in enumerate(requests) if sample_rows[i] and _needs_extras(r)]
    if not rows:
        return None
    reqs = [requests[i] for i in rows]
    params = [r.sampling_params for r in reqs]
    penalised = [p.has_penalties for p in params]
    prompt_ids, prompt_offsets = _ragged(
        [r.all_token_ids[:r.num_prompt_tokens] if pen else [] for r, pen in zip(reqs, penalised)],
        np.int32)
    output_ids, output_offsets = _ragged(
        [r.output_token_ids if pen else [] for r, pen in zip(reqs, penalised)], np.int32)
    biases = [sorted((p.logit_bias or {}).items()) for p in params]
    bias_ids, bias_offsets = _ragged([[t for t, _ in b] for b in biases], np.int32)
    bias_values, _ = _ragged([[v for _, v in b] for b in biases], np.float32)
    banned_ids, banned_offsets = _ragged([banned_until_min_tokens(r) for r in reqs], np.int32)
    return SamplingExtras(
        rows=np.array(rows, np.int32),
        presence_penalty=np.array([p.presence_penalty for p in params], np.float32),
        frequency_penalty=np.array([p.frequency_penalty for p in params], np.float32),
        repetition_penalty=np.array([p.repetition_penalty for p in params], np.float64),
        prompt_ids=prompt_ids, prompt_offsets=prompt_offsets,
        output_ids=output_ids, output_offsets=output_offsets,
        bias_ids=bias_ids, bias_values=bias_values, bias_offsets=bias_offsets,
        banned_ids=banned_ids, banned_offsets=banned_offsets)


def prompt_positions_to_score(request: Request, computed: int, num_new: int) -> range:
    """Positions of this chunk whose logits predict a prompt token (position p predicts token
    p + 1), less those already sent (a preempted request runs its prompt again)."""
    if request.sampling_params.prompt_logprobs is None:
        return range(0)
    start = max(computed, request.num_prompt_logprobs_done)
    return range(start, max(start, min(computed + num_new, request.num_prompt_tokens - 1)))


def pack_prompt_logprobs_wanted(scheduled: list[tuple[Request, int]],
                                computed: list[int]) -> PromptLogprobsWanted | None:
    rows, spans = [], []
    for i, ((request, num_new), c) in enumerate(zip(scheduled, computed)):
        span = prompt_positions_to_score(request, c, num_new)
        if span:
            rows.append(i)
            spans.append((request, c, span))
    if not rows:
        return None
    targets, offsets = _ragged([r.all_token_ids[s.start + 1:s.stop + 1] for r, _, s in spans],
                               np.int32)
    return PromptLogprobsWanted(
        rows=np.array(rows, np.int32),
        num=np.array([r.sampling_params.prompt_logprobs for r, _, _ in spans], np.int32),
        first=np.array([s.start - c for _, c, s in spans], np.int32),
        targets=targets, offsets=offsets)
