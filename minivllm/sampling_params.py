"""How to sample one request. In vLLM: vllm/sampling_params.py."""

from __future__ import annotations

import math

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
    # vLLM's penalties and logits processors (vllm/sampling_params.py:296-350, 409); applied by
    # minivllm/model/penalties.py in the order of vllm/v1/sample/sampler.py:87-97
    presence_penalty: float = 0.0  # minus this once for every token already in the output
    frequency_penalty: float = 0.0  # minus this times the token's count in the output
    repetition_penalty: float = 1.0  # >1 discourages tokens of the prompt or the output
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit
    min_tokens: int = 0  # stop tokens (EOS, stop_token_ids) are banned before this many
    prompt_logprobs: int | None = None  # each prompt token's logprob and this many top ones

    def __post_init__(self) -> None:
        if not math.isfinite(self.temperature):  # vllm/sampling_params.py:656-661
            raise ValueError(f"temperature must be a finite number, got {self.temperature}")
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
        self._check_penalties()
        if self.seed is not None:
            if type(self.seed) is not int or not SEED_MIN <= self.seed <= SEED_MAX:
                raise ValueError(f"seed must be an integer in [-2**63, 2**63 - 1], got "
                                 f"{self.seed!r}; -1 or None for an unseeded request")
            if self.seed == -1:  # vLLM's "no seed" (vllm/sampling_params.py (SamplingParams.__post_init__))
                self.seed = None

    def _check_penalties(self) -> None:
        """vLLM's ranges (vllm/sampling_params.py:637-655, 697-705) and its logit_bias clamp to
        [-100, 100] (vllm/sampling_params.py:508)."""
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not -2.0 <= value <= 2.0:  # also refuses NaN
                raise ValueError(f"{name} must be in [-2, 2], got {value}")
        if not (math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0):
            raise ValueError(f"repetition_penalty must be a finite number greater than zero, "
                             f"got {self.repetition_penalty}")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"min_tokens must be in [0, max_tokens={self.max_tokens}], got "
                             f"{self.min_tokens}")
        if self.prompt_logprobs is not None and self.prompt_logprobs < 0:
            raise ValueError(f"prompt_logprobs must be None or >= 0, got {self.prompt_logprobs}")
        if self.logit_bias:
            for token, bias in self.logit_bias.items():
                if math.isnan(bias):
                    raise ValueError(f"logit_bias of token {token} is NaN")
            self.logit_bias = {t: min(100.0, max(-100.0, b)) for t, b in self.logit_bias.items()}

    @property
    def has_penalties(self) -> bool:
        return (self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
                or self.repetition_penalty != 1.0)
