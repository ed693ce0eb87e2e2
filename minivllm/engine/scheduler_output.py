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


class ModelRunnerOutput(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    req_ids: list[str]
    sampled_token_ids: np.ndarray  # int32 (B,): -1 for rows that did not sample
    # with SchedulerOutput.num_logprobs: per row the sampled token then the top K (vLLM's
    # LogprobsLists, vllm/v1/outputs.py), K the most any row asked for; rank of the sampled
    logprob_token_ids: np.ndarray | None = None  # int32 (B, 1 + K)
    logprobs: np.ndarray | None = None  # float32 (B, 1 + K)
    sampled_token_ranks: np.ndarray | None = None  # int32 (B,)
