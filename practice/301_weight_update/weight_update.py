"""Exercise 301: an all-or-nothing weight update, in place, by name. Read README.md here.

Grade with: python judge.py 301
"""

from __future__ import annotations

import torch


class WeightMismatchError(ValueError):
    """The update does not fit the engine's weights; nothing was changed."""


def apply_update(target: dict[str, torch.Tensor], update: dict[str, torch.Tensor]) -> list[str]:
    # TODO 1: check every name, shape and dtype of `update` against `target`; collect problems
    # TODO 2: if any, raise WeightMismatchError naming each tensor with both shapes (or dtypes)
    # TODO 3: copy each update into its target in place; return the names in update's order
    raise NotImplementedError
