"""What a step costs, learned from the steps the engine ran: a running least-squares fit of
step time = fixed + per_decode * decodes + per_row * (padded rows - decodes).

The scheduler uses it to size prompt chunks to a step time the running streams can bear
(--target-itl-ms): a step that carries prompt tokens delays every decode in it, and a decode's
delay is the inter-token latency its user sees. Old steps fade (each new one multiplies the old
weights by DECAY), so the fit follows the machine when other programs slow it down. vLLM has no
such model: it caps a step at a fixed token count (max_num_batched_tokens,
vllm/v1/core/sched/scheduler.py:719-722) and a request's chunk at long_prefill_token_threshold
(scheduler.py:759-768, 844-845, 1332-1333).

Padded rows: the C GEMM computes a vector of rows at a time (custom_ops.gemm_row_multiple: 16
with AVX-512), so a step's rows are padded up to a multiple. Measured on the bundled model
(2-vCPU Zen 4, float16 cache, layers and the greedy head), 17 decodes cost 50 ms and 32 cost 55
ms, but 33 cost 77. The padding is a row's cost, paid whether or not a prompt token fills it;
the budget fills it.
"""

from __future__ import annotations

import numpy as np

DECAY = 0.98  # a step's weight after 50 newer steps: 0.36
MIN_PREFILL_STEPS = 4  # steps with prompt tokens seen before the fit is trusted


class StepCostModel:
    """Running fit of seconds per step over (1, decodes, padded rows - decodes)."""

    def __init__(self, row_multiple: int = 1) -> None:
        self.row_multiple = row_multiple
        self.xtx = np.zeros((3, 3))
        self.xty = np.zeros(3)
        self.prefill_steps = 0
        self.coef: np.ndarray | None = None  # fixed s, s per decode, s per other padded row

    def padded(self, rows: int) -> int:
        return -(-rows // self.row_multiple) * self.row_multiple

    def features(self, decodes: int, prefill_tokens: int) -> np.ndarray:
        return np.array([1.0, decodes, self.padded(decodes + prefill_tokens) - decodes])

    def observe(self, decodes: int, prefill_tokens: int, seconds: float) -> None:
        x = self.features(decodes, prefill_tokens)
        self.xtx = DECAY * self.xtx + np.outer(x, x)
        self.xty = DECAY * self.xty + seconds * x
        self.prefill_steps += prefill_tokens > 0
        if self.prefill_steps >= MIN_PREFILL_STEPS:  # lstsq: solvable before all features vary
            self.coef = np.linalg.lstsq(self.xtx, self.xty, rcond=None)[0]

    def predict(self, decodes: int, prefill_tokens: int) -> float | None:
        if self.coef is None:
            return None
        return float(self.coef @ self.features(decodes, prefill_tokens))

    def prefill_budget(self, decodes: int, target_s: float) -> int | None:
        """Prompt tokens a step with `decodes` decodes can carry and stay within target_s: the
        rows that fit, down to a multiple of row_multiple, less the decodes (0 where the decodes
        fill them); None while the fit is not trusted (no cap then)."""
        if self.coef is None or self.coef[2] <= 0:
            return None
        spare = target_s - self.coef[0] - self.coef[1] * decodes
        rows = decodes + max(0, int(spare / self.coef[2] + 1e-6))  # + 1e-6: 31.9999 are 32
        return max(0, rows // self.row_multiple * self.row_multiple - decodes)

    def free_rows(self, decodes: int) -> int:
        """The padding a step of `decodes` decodes computes anyway: prompt tokens there are free."""
        return self.padded(decodes) - decodes
