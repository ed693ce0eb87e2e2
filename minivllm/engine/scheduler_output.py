"""What the scheduler sends the workers each step, and what a worker sends back.

Both are msgspec Structs of numpy arrays, so a later chapter can broadcast a SchedulerOutput
to tensor-parallel workers over the shared-memory MessageQueue without touching Python lists.
Each step carries everything the worker needs (the tokens to run, the full block tables, the
sampling parameters), so the worker keeps no per-request state; vLLM sends diffs instead
(SchedulerOutput, vllm/v1/core/sched/output.py (SchedulerOutput); ModelRunnerOutput,
vllm/v1/outputs.py (ModelRunnerOutput)) to keep large batches cheap.
Rows are requests, in the scheduler's order; token arrays are flat, rows one after another.
"""

from __future__ import annotations

import msgspec
import numpy as np


class SamplingExtras(msgspec.Struct, array_like=True, gc=False):
    """Penalties, logit_bias and min_tokens of the sampling rows that use any of them; absent
    when none does. Each ragged list is flat with offsets (R + 1,). The worker keeps no token
    history, so a penalised row brings its prompt and output ids every step (vLLM keeps them in
    the worker's InputBatch, vllm/v1/worker/gpu_input_batch.py)."""

    rows: np.ndarray  # int32 (R,): the step's rows these apply to
    presence_penalty: np.ndarray  # float32 (R,)
    frequency_penalty: np.ndarray  # float32 (R,)
    repetition_penalty: np.ndarray  # float64 (R,): float32 would make 1e-300 a zero
    prompt_ids: np.ndarray  # int32, the prompts of rows with a penalty (else empty)
    prompt_offsets: np.ndarray  # int64 (R + 1,)
    output_ids: np.ndarray  # int32, the outputs so far of rows with a penalty (else empty)
    output_offsets: np.ndarray  # int64 (R + 1,)
    bias_ids: np.ndarray  # int32, logit_bias's tokens
    bias_values: np.ndarray  # float32, what each adds
    bias_offsets: np.ndarray  # int64 (R + 1,)
    banned_ids: np.ndarray  # int32: stop tokens of rows short of min_tokens
    banned_offsets: np.ndarray  # int64 (R + 1,)


class PromptLogprobsWanted(msgspec.Struct, array_like=True, gc=False):
    """Rows of prompt chunks whose positions must score the next prompt token (echo with
    logprobs). A row's positions first .. first + count - 1 of its chunk predict targets;
    targets are flat, row after row. vLLM computes these during the prefill too
    (GPUModelRunner._get_prompt_logprobs_dict, vllm/v1/worker/gpu_model_runner.py)."""

    rows: np.ndarray  # int32 (R,)
    num: np.ndarray  # int32 (R,): top logprobs wanted besides the prompt token's own
    first: np.ndarray  # int32 (R,): the first scored position within the row's chunk
    targets: np.ndarray  # int32: the prompt token after each scored position
    offsets: np.ndarray  # int64 (R + 1,) into targets


class PromptLogprobs(msgspec.Struct, array_like=True, gc=False):
    """The scored positions of PromptLogprobsWanted, in its order: per position the prompt
    token then the top K (K the most any row asked for), and the prompt token's rank."""

    token_ids: np.ndarray  # int32 (N, 1 + K)
    logprobs: np.ndarray  # float32 (N, 1 + K)
    ranks: np.ndarray  # int32 (N,)


class SchedulerOutput(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    req_ids: list[str]
    num_scheduled_tokens: np.ndarray  # int32 (B,): query tokens of each row this step
    num_computed_tokens: np.ndarray  # int32 (B,): tokens already in the cache before this step
    input_token_ids: np.ndarray  # int32 (T,): the scheduled tokens, row after row
    block_tables: np.ndarray  # int32 (B, max_blocks), padded with 0
    sample_rows: np.ndarray  # bool (B,): the row reaches its last known token and samples
    temperature: np.ndarray  # float32 (B,)
    top_p: np.ndarray  # float32 (B,)
    top_k: np.ndarray  # int32 (B,), 0: off
    seeds: np.ndarray  # int64 (B,), -1: unseeded
    num_output_tokens: np.ndarray  # int32 (B,): how many tokens the row has sampled so far
    finished_req_ids: list[str] = []  # finished since the last step (for stateful workers)
    num_logprobs: np.ndarray | None = None  # int32 (B,): top logprobs wanted, -1: none
    sampling_extras: SamplingExtras | None = None
    prompt_logprobs: PromptLogprobsWanted | None = None


class ModelRunnerOutput(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    req_ids: list[str]
    sampled_token_ids: np.ndarray  # int32 (B,): -1 for rows that did not sample
    # with SchedulerOutput.num_logprobs: per row the sampled token then the top K (vLLM's
    # LogprobsLists, vllm/v1/outputs.py), K the most any row asked for; rank of the sampled
    logprob_token_ids: np.ndarray | None = None  # int32 (B, 1 + K)
    logprobs: np.ndarray | None = None  # float32 (B, 1 + K)
    sampled_token_ranks: np.ndarray | None = None  # int32 (B,)
    prompt_logprobs: PromptLogprobs | None = None  # for SchedulerOutput.prompt_logprobs
    failed: dict[str, str] = {}  # request id -> why its row failed (the others' went on)
