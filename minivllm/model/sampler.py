"""Sampling a batch of logits: greedy, temperature, top-k, top-p and a per-request seed.

Random rows draw by the exponential race (argmax of p / E with E ~ Exp(1) is a sample from p),
as vLLM does, so one code path serves every row. A seeded request draws its noise from a
generator seeded by (seed, number of tokens it has sampled so far): the result depends on
neither the batch it ran in nor on a preemption, and the worker keeps no generator state.
In vLLM: Sampler in vllm/v1/sample/sampler.py; random_sample (the exponential race) in
vllm/v1/sample/ops/topk_topp_sampler.py.
"""

from __future__ import annotations

import torch

from minivllm.model import custom_ops

GREEDY_BELOW = 1e-5  # temperatures under this are greedy (vLLM: _SAMPLING_EPS in vllm/sampling_params.py)
SEED_STRIDE = 1_000_003  # mixes the step into the seed: (seed, step) -> one generator seed


def sample(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor,
           top_k: torch.Tensor, seeds: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """logits (B, V) float32 -> token ids (B,) int64. seeds -1 means unseeded (SamplingParams
    turns a seed of -1 into None, so no seeded request reaches here as -1)."""
    greedy = custom_ops.argmax(logits)
    random_rows = (temperature >= GREEDY_BELOW).nonzero().flatten()
    if random_rows.numel() == 0:
        return greedy
    rows = logits[random_rows] / temperature[random_rows, None]
    probs, order = _top_k_top_p(rows, top_k[random_rows], top_p[random_rows])
    noise = torch.empty_like(probs).exponential_()
    for j, i in enumerate(random_rows.tolist()):
        if seeds[i] != -1:  # any 64-bit seed, mixed with the step into manual_seed's range
            mixed = (int(seeds[i]) * SEED_STRIDE + int(steps[i])) % 2**64
            g = torch.Generator().manual_seed(mixed)
            noise[j].exponential_(generator=g)
    picked = (probs / noise).argmax(dim=-1)
    greedy[random_rows] = order.gather(1, picked[:, None]).squeeze(1)
    return greedy


def compute_logprobs(logits: torch.Tensor, sampled: torch.Tensor, num_top: int
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Log-probabilities from the raw logits that sampled the tokens (before temperature,
    top-k and top-p: vLLM's default logprobs_mode "raw_logprobs"). Returns token ids and their
    logprobs (B, 1 + num_top), the sampled token first, then the top `num_top`, and the sampled
    token's rank (B,), 1 for the most likely. In vLLM: Sampler.gather_logprobs,
    vllm/v1/sample/sampler.py (the rank is the count of tokens at least as likely)."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    sampled = sampled.long()[:, None]
    sampled_lp = logprobs.gather(1, sampled)
    ranks = (logprobs >= sampled_lp).sum(dim=-1)
    top_lp, top_ids = logprobs.topk(num_top, dim=-1)
    return torch.cat([sampled, top_ids], 1), torch.cat([sampled_lp, top_lp], 1), ranks


def _top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor,
                 top_p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Probabilities in descending order with the tail masked, and the order (token ids)."""
    vocab = logits.shape[-1]
    if bool((top_k <= 0).all()) and bool((top_p >= 1).all()):
        return torch.softmax(logits, dim=-1), torch.arange(vocab).expand(logits.shape[0], vocab)
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    rank = torch.arange(vocab)[None, :]
    k = torch.where(top_k > 0, top_k, vocab)[:, None]
    sorted_logits = sorted_logits.masked_fill(rank >= k, float("-inf"))
    probs = torch.softmax(sorted_logits, dim=-1)
    before = probs.cumsum(dim=-1) - probs  # mass of the tokens ranked above this one
    probs = probs.masked_fill(before >= top_p[:, None], 0.0)  # the top token always stays
    return probs, order
