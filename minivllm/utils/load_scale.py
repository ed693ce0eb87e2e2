"""Waits that only guard against a hang, stretched on a busy machine.

A start-up timeout (a child importing torch, an engine loading its model, Ray placing actors)
says "stuck", never "slow": on a machine whose run queue is longer than its cores, the same
start takes longer, and the limit must grow with it, or a busy machine reads as a hang. The
factor is the one the judge applies to its time limits (minivllm/judge/runner.time_scale): the
1-minute load average per core, at least 1, at most MAX_SCALE. MINIVLLM_TIME_SCALE sets it.
"""

from __future__ import annotations

import os

SCALE_ENV = "MINIVLLM_TIME_SCALE"
MAX_SCALE = 4.0  # load 8 per core waits 4x, as load 4 does: past that a wait is a hang


def load_scale() -> float:
    """How much longer a start takes here now than on an idle machine, as a factor >= 1."""
    if os.environ.get(SCALE_ENV):
        return float(os.environ[SCALE_ENV])
    return max(1.0, min(MAX_SCALE, os.getloadavg()[0] / (os.cpu_count() or 1)))


def stretched(seconds: float) -> float:
    """A hang check's limit of `seconds` on an idle machine, stretched for the load now."""
    return seconds * load_scale()


def why_stretched(seconds: float, limit: float) -> str:
    """' (stretched to N s: load L on C cores)' when limit > seconds, else ''; for messages
    that name the limit a caller asked for."""
    if limit <= seconds:
        return ""
    return (f" (stretched to {limit:.3g} s: load {os.getloadavg()[0]:.1f} on "
            f"{os.cpu_count() or 1} cores)")
