"""How to sample one request. In vLLM: vllm/sampling_params.py."""

from __future__ import annotations

import msgspec


# A seed is a 64-bit integer, as vLLM's OpenAI API takes it
# (vllm/entrypoints/openai/completion/protocol.py (CompletionRequest)); any other negative value is a seed too.
SEED_MIN, SEED_MAX = -2**63, 2**63 - 1


class SamplingParams(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: no top-k
    seed: int | None = None
    max_tokens: int = 16
    stop: list[str] = []
    stop_token_ids: list[int] = []
    ignore_eos: bool = False
    logprobs: int | None = None  # the sampled token's logprob and this many top ones

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be -1, 0 or positive, got {self.top_k}")
        if self.logprobs is not None and self.logprobs < 0:
            raise ValueError(f"logprobs must be None or >= 0, got {self.logprobs}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.seed is not None:
            if type(self.seed) is not int or not SEED_MIN <= self.seed <= SEED_MAX:
                raise ValueError(f"seed must be an integer in [-2**63, 2**63 - 1], got "
                                 f"{self.seed!r}; -1 or None for an unseeded request")
            if self.seed == -1:  # vLLM's "no seed" (vllm/sampling_params.py (SamplingParams.__post_init__))
                self.seed = None
