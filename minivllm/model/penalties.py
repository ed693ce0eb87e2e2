"""The logits processors that change which token wins, before sampling: min_tokens, logit_bias,
then the repetition, frequency and presence penalties, in vLLM's order
(vllm/v1/sample/sampler.py:87-97, apply_logits_processors at :436-470).

- min_tokens: the stop tokens get -inf until the request has that many outputs
  (vllm/v1/sample/logits_processor/builtin.py:279-288).
- logit_bias: added to the named tokens' logits (builtin.py:159-162).
- repetition: a token seen in the prompt or the output has a positive logit divided by the
  penalty and a negative one multiplied by it (vllm/_custom_ops.py:383-396).
- frequency and presence: minus the penalty times the token's count in the output, and minus
  the penalty once if it is there at all (vllm/model_executor/layers/utils.py:76-80).
"""

from __future__ import annotations

import numpy as np
import torch

from minivllm.engine.scheduler_output import SamplingExtras


def _spans(offsets: np.ndarray) -> list[slice]:
    return [slice(int(a), int(b)) for a, b in zip(offsets[:-1], offsets[1:])]


def _in_vocab(ids: np.ndarray, vocab: int) -> torch.Tensor:
    return torch.from_numpy(ids[(ids >= 0) & (ids < vocab)].astype(np.int64))


def _penalise(row: torch.Tensor, prompt: torch.Tensor, output: torch.Tensor,
              presence: float, frequency: float, repetition: float) -> None:
    vocab = row.numel()
    counts = torch.bincount(output, minlength=vocab)[:vocab].to(row.dtype)
    if repetition != 1.0:
        seen = counts > 0
        seen[prompt] = True
        # in float64 and as tensors: any finite penalty > 0 (vLLM's range), 1e-300 too, gives
        # a scale (infinite at worst), never a ZeroDivisionError
        penalty = torch.tensor(repetition, dtype=torch.float64)
        scale = torch.where(row > 0, 1.0 / penalty, penalty)
        row.copy_(torch.where(seen, row * scale, row))
    row -= frequency * counts + presence * (counts > 0).to(row.dtype)


def _apply_row(row: torch.Tensor, e: SamplingExtras, i: int, spans: tuple) -> None:
    vocab = row.numel()
    banned, bias, prompt, output = spans
    row[_in_vocab(e.banned_ids[banned], vocab)] = float("-inf")
    ids = e.bias_ids[bias]
    keep = (ids >= 0) & (ids < vocab)
    row[torch.from_numpy(ids[keep].astype(np.int64))] += torch.from_numpy(e.bias_values[bias][keep])
    if e.repetition_penalty[i] != 1 or e.frequency_penalty[i] or e.presence_penalty[i]:
        _penalise(row, _in_vocab(e.prompt_ids[prompt], vocab),
                  _in_vocab(e.output_ids[output], vocab), float(e.presence_penalty[i]),
                  float(e.frequency_penalty[i]), float(e.repetition_penalty[i]))


def apply_sampling_extras(logits: torch.Tensor, extras: SamplingExtras,
                          row_of_step_row: dict[int, int]) -> dict[int, str]:
    """In place on logits (n, V) whose row row_of_step_row[r] samples the step's row r.
    Returns {step row: error} for the rows whose settings raised: those requests fail alone,
    the rest of the step goes on."""
    e, failed = extras, {}
    for i, (step_row, *spans) in enumerate(zip(
            e.rows.tolist(), _spans(e.banned_offsets), _spans(e.bias_offsets),
            _spans(e.prompt_offsets), _spans(e.output_offsets))):
        try:
            _apply_row(logits[row_of_step_row[step_row]], e, i, spans)
        except Exception as err:  # noqa: BLE001 - a request's settings fail that request only
            failed[step_row] = f"sampling settings failed: {type(err).__name__}: {err}"
    return failed
