"""Exercise 301: an all-or-nothing weight update, in place, by name. Read README.md here.

Grade with: python judge.py 301
"""

from __future__ import annotations

import torch


class WeightMismatchError(ValueError):  # pragma: no mutate block
    """The update does not fit the engine's weights; nothing was changed."""


def apply_update(target: dict[str, torch.Tensor], update: dict[str, torch.Tensor]) -> list[str]:
    problems = []
    for name, new in update.items():
        old = target.get(name)
        if old is None:
            problems.append(f"{name!r}: the engine has no such weight")
        elif old.shape != new.shape:
            problems.append(f"{name!r}: engine shape {list(old.shape)}, update shape {list(new.shape)}")
        elif old.dtype != new.dtype:
            problems.append(f"{name!r}: engine dtype {old.dtype}, update dtype {new.dtype}")
    if problems:
        raise WeightMismatchError("nothing was changed: " + "; ".join(problems))
    with torch.no_grad():
        for name, new in update.items():
            target[name].copy_(new)
    return list(update)
