"""What a step costs, learned from the steps the engine ran: a running least-squares fit of
step time = fixed + per_decode * decodes + per_prefill_token * prefill tokens.

The scheduler uses it to size prompt chunks to a step time the running streams can bear
(--target-itl-ms): a step that carries prompt tokens delays every decode in it, and a decode's
delay is the inter-token latency its user sees. Old steps fade (each new one multiplies the old
weights by DECAY), so the fit follows the machine when other programs slow it down. vLLM has no
such model: it caps a step at a fixed token count (max_num_batched_tokens,
vllm/v1/core/sched/scheduler.py:719-722) and a request's chunk at long_prefill_token_threshold
(scheduler.py:759-768, 844-845, 1332-1333).
"""

from __future__ import annotations

import numpy as np

DECAY = 0.98  # a step's weight after 50 newer steps: 0.36
MIN_PREFILL_STEPS = 4  # steps with prompt tokens seen before the fit is trusted


class StepCostModel:
    """Running fit of seconds per step over (1, decodes, prefill tokens)."""

    def __init__(self) -> None:
        self.xtx = np.zeros((3, 3))
        self.xty = np.zeros(3)
        self.prefill_steps = 0
        self.coef: np.ndarray | None = None  # fixed s, s per decode, s per prefill token

    def observe(self, decodes: int, prefill_tokens: int, seconds: float) -> None:
        x = np.array([1.0, decodes, prefill_tokens])
        self.xtx = DECAY * self.xtx + np.outer(x, x)
        self.xty = DECAY * self.xty + seconds * x
        self.prefill_steps += prefill_tokens > 0
        if self.prefill_steps >= MIN_PREFILL_STEPS:  # lstsq: solvable before all features vary
            self.coef = np.linalg.lstsq(self.xtx, self.xty, rcond=None)[0]

    def predict(self, decodes: int, prefill_tokens: int) -> float | None:
        if self.coef is None:
            return None
        return float(self.coef @ np.array([1.0, decodes, prefill_tokens]))

    def prefill_budget(self, decodes: int, target_s: float) -> int | None:
        """Prompt tokens a step with `decodes` decodes can carry and stay within target_s;
        None while the fit is not trusted (no cap then)."""
        if self.coef is None or self.coef[2] <= 0:
            return None
        spare = target_s - self.coef[0] - self.coef[1] * decodes
        return max(0, int(spare / self.coef[2] + 1e-6))  # + 1e-6: 31.9999 tokens are 32
