"""Turn a SchedulerOutput into one forward pass and a sampled token per finishing row.

Rows with one query token (decodes) are moved to the front, so that attention can treat them
as one batch; the sampled tokens are mapped back to the scheduler's row order at the end.
In vLLM: GPUModelRunner in vllm/v1/worker/gpu_model_runner.py (its _prepare_inputs and
execute_model).
"""

from __future__ import annotations

import numpy as np
import torch

from minivllm.engine.config import EngineConfig
from minivllm.engine.scheduler_output import (
    ModelRunnerOutput, PromptLogprobs, PromptLogprobsWanted, SamplingExtras, SchedulerOutput)
from minivllm.model.attention import AttentionMetadata, PrefillChunk
from minivllm.model.llama import LlamaModel
from minivllm.model.loader import load_weights
from minivllm.model.penalties import apply_sampling_extras
from minivllm.model.sampler import GREEDY_BELOW, compute_logprobs, sample
from minivllm.utils import tracing

PROMPT_LOGPROBS_ROWS = 128  # positions scored at once: 128 x 49,152 float32 logits = 25 MB


class ModelRunner:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.block_size = config.block_size
        self.model: LlamaModel | None = None
        self.kv_caches: list[torch.Tensor] = []

    def load_model(self) -> None:
        weights = load_weights(self.config.model, self.config.model_config,
                               self.config.quantization)
        self.model = LlamaModel(self.config.model_config, weights, self.config.torch_dtype,
                                kv_cache_dtype=self.config.cache_torch_dtype)

    def initialize_kv_cache(self, num_blocks: int) -> None:
        self.kv_caches = self.model.allocate_kv_cache(num_blocks, self.block_size)

    def execute_model(self, so: SchedulerOutput) -> ModelRunnerOutput:
        num_rows = len(so.req_ids)
        q_lens = so.num_scheduled_tokens.astype(np.int64)
        order = np.argsort(q_lens != 1, kind="stable")  # decodes first
        starts = np.concatenate([[0], np.cumsum(q_lens)[:-1]])
        q_lens, computed = q_lens[order], so.num_computed_tokens[order].astype(np.int64)
        tables = so.block_tables[order].astype(np.int64)
        token_idx = (np.arange(so.input_token_ids.size) if (order == np.arange(num_rows)).all()
                     else np.concatenate([np.arange(s, s + n) for s, n in zip(starts[order], q_lens)]))
        new_starts = np.concatenate([[0], np.cumsum(q_lens)])
        row_of_token = np.repeat(np.arange(num_rows), q_lens)
        positions = np.arange(new_starts[-1]) - new_starts[row_of_token] + computed[row_of_token]
        slots = tables[row_of_token, positions // self.block_size] * self.block_size \
            + positions % self.block_size
        meta = self._attention_metadata(q_lens, computed, tables, new_starts, slots)
        with tracing.span("forward"):
            hidden = self.model.forward(
                torch.from_numpy(so.input_token_ids[token_idx].astype(np.int64)),
                torch.from_numpy(positions), self.kv_caches, meta)
        prompt_lps = (None if so.prompt_logprobs is None else
                      self._prompt_logprobs(so.prompt_logprobs, hidden, new_starts, order))
        rows = np.flatnonzero(so.sample_rows[order])
        sampled = np.full(num_rows, -1, np.int32)
        if rows.size:
            last = new_starts[rows + 1] - 1  # each sampled row's last token; increasing
            hidden = hidden if last.size == len(hidden) else hidden[torch.from_numpy(last)]
            orig = order[rows]
            tokens = self._greedy_tokens(so, hidden, orig)
            if tokens is not None:  # every row greedy: no logits needed, only their argmax
                sampled[orig] = tokens.numpy()
                return ModelRunnerOutput(req_ids=so.req_ids, sampled_token_ids=sampled,
                                         prompt_logprobs=prompt_lps)
            logits = self.model.compute_logits(hidden)
            if logits is None:  # a tensor-parallel rank that is not the output rank
                return ModelRunnerOutput(req_ids=so.req_ids, sampled_token_ids=sampled)
            with tracing.span("sample"):
                processed, failed = self._processed(logits, so.sampling_extras, orig)
                tokens = sample(processed, *(torch.from_numpy(a[orig]) for a in (
                    so.temperature, so.top_p, so.top_k, so.seeds, so.num_output_tokens)))
            sampled[orig] = tokens.numpy()
            if so.num_logprobs is not None and (so.num_logprobs[orig] >= 0).any():
                out = self._with_logprobs(so, logits, tokens, orig, sampled)
            else:
                out = ModelRunnerOutput(req_ids=so.req_ids, sampled_token_ids=sampled)
            out.prompt_logprobs = prompt_lps
            out.failed = {so.req_ids[r]: why for r, why in failed.items()}
            return out
        return ModelRunnerOutput(req_ids=so.req_ids, sampled_token_ids=sampled,
                                 prompt_logprobs=prompt_lps)

    def _greedy_tokens(self, so: SchedulerOutput, hidden: torch.Tensor,
                       orig: np.ndarray) -> torch.Tensor | None:
        """The rows' greedy tokens straight from the hidden states (LlamaModel.greedy_tokens)
        where every row is greedy and wants nothing else of its logits (no penalties, logit
        bias, min_tokens or logprobs); else None, and the step computes the logits."""
        if (so.sampling_extras is not None or (so.temperature[orig] >= GREEDY_BELOW).any()
                or (so.num_logprobs is not None and (so.num_logprobs[orig] >= 0).any())):
            return None
        with tracing.span("greedy_head"):
            return self.model.greedy_tokens(hidden)

    def _prompt_logprobs(self, wanted: PromptLogprobsWanted, hidden: torch.Tensor,
                         new_starts: np.ndarray, order: np.ndarray) -> PromptLogprobs | None:
        """Score the wanted prompt positions PROMPT_LOGPROBS_ROWS at a time, so the logits and
        their log-softmax never hold more than that many rows of the vocabulary; None on a
        tensor-parallel rank that is not the output rank (which still joins every gather)."""
        place = np.argsort(order)  # the step's row -> its row in the reordered batch
        k = int(wanted.num.max())
        parts, output_rank = [], True
        for i, row in enumerate(wanted.rows.tolist()):
            first = int(new_starts[place[row]]) + int(wanted.first[i])
            targets = wanted.targets[wanted.offsets[i]:wanted.offsets[i + 1]]
            for a in range(0, len(targets), PROMPT_LOGPROBS_ROWS):
                chunk = targets[a:a + PROMPT_LOGPROBS_ROWS]
                logits = self.model.compute_logits(hidden[first + a:first + a + len(chunk)])
                output_rank = logits is not None
                if output_rank:
                    parts.append(compute_logprobs(logits, torch.from_numpy(chunk), k))
        if not output_rank:
            return None
        ids, lps, ranks = (torch.cat(t).numpy() for t in zip(*parts))
        return PromptLogprobs(ids.astype(np.int32), lps.astype(np.float32), ranks.astype(np.int32))

    @staticmethod
    def _processed(logits: torch.Tensor, extras: SamplingExtras | None,
                   orig: np.ndarray) -> tuple[torch.Tensor, dict[int, str]]:
        """The logits to sample from: with penalties, logit_bias and min_tokens applied to a
        copy, so that logprobs still come from the raw logits (vLLM's "raw_logprobs"); and the
        step rows whose settings failed."""
        if extras is None:
            return logits, {}
        processed = logits.clone()
        failed = apply_sampling_extras(processed, extras, {int(r): j for j, r in enumerate(orig)})
        return processed, failed

    @staticmethod
    def _with_logprobs(so: SchedulerOutput, logits: torch.Tensor, tokens: torch.Tensor,
                       orig: np.ndarray, sampled: np.ndarray) -> ModelRunnerOutput:
        """The step's output with the logprobs of the same logits that sampled its tokens."""
        num_top = int(so.num_logprobs[orig].max())
        ids, lps, ranks = compute_logprobs(logits, tokens, num_top)
        out = ModelRunnerOutput(req_ids=so.req_ids, sampled_token_ids=sampled,
                                logprob_token_ids=np.zeros((len(sampled), 1 + num_top), np.int32),
                                logprobs=np.zeros((len(sampled), 1 + num_top), np.float32),
                                sampled_token_ranks=np.zeros(len(sampled), np.int32))
        out.logprob_token_ids[orig], out.logprobs[orig] = ids.numpy(), lps.numpy()
        out.sampled_token_ranks[orig] = ranks.numpy()
        return out

    def _attention_metadata(self, q_lens: np.ndarray, computed: np.ndarray, tables: np.ndarray,
                            starts: np.ndarray, slots: np.ndarray) -> AttentionMetadata:
        bs = self.block_size
        seq_lens = computed + q_lens
        num_decodes = int((q_lens == 1).sum())
        meta = AttentionMetadata(slot_mapping=torch.from_numpy(slots), num_decodes=num_decodes)
        if num_decodes:
            max_blocks = int(-(-seq_lens[:num_decodes].max() // bs))
            # contiguous once here, not in each of the layers' attention calls
            meta.decode_block_tables = torch.from_numpy(
                np.ascontiguousarray(tables[:num_decodes, :max_blocks]))
            meta.decode_seq_lens = torch.from_numpy(seq_lens[:num_decodes])
        for row in range(num_decodes, len(q_lens)):
            ctx = int(seq_lens[row])
            meta.prefills.append(PrefillChunk(int(starts[row]), int(starts[row + 1]), ctx,
                                              torch.from_numpy(tables[row, :-(-ctx // bs)])))
        return meta
