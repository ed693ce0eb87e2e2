"""A step's forward with prompt chunks, in the one-call C loop (decode_step.c, each prompt
token attending as a decode of its own length) against op by op (attention.py's SDPA per chunk),
timed side by side (paired_timing.py) on the bundled model.

    python scripts/mixed_step_bench.py [--shapes 32:16x1 32:64x1 0:64x8 0:512x1 0:512x1@2048]

A shape is DECODES:CHUNKxCOUNT[@CONTEXT]: DECODES running sequences of 160 tokens, COUNT prompt
chunks of CHUNK tokens each ending at CONTEXT tokens (default: the chunk is the whole prompt).
It prints both ways' milliseconds, their ratio and the largest difference in the hidden states.
"""

from __future__ import annotations

import argparse
import os

import torch

from minivllm.engine.config import EngineConfig
from minivllm.model.paired_timing import paired_ratio
from minivllm.model.random_step import random_step
from minivllm.worker.model_runner import ModelRunner

BS, DECODE_LEN = 16, 160


def step(model, decodes: int, chunk: int, count: int, context: int):
    """ids, positions, caches, meta for one step of that shape over a random cache."""
    return random_step(model, [DECODE_LEN] * decodes, [(chunk, context)] * count, BS, seed=0)


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+",
                    default=["32:16x1", "32:64x1", "0:64x8", "32:64x4", "0:512x1", "0:512x1@2048"])
    ap.add_argument("--budget-s", type=float, default=1.0)
    args = ap.parse_args()
    runner = ModelRunner(EngineConfig())
    runner.load_model()
    model = runner.model
    c_step = model.decode_step
    assert c_step is not None, "the C step does not run on this machine or model"
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"{'shape':>14} {'C loop ms':>10} {'ops ms':>8} {'ops/C':>6} {'max |diff|':>10}")
    for shape in args.shapes:
        head, _, ctx = shape.partition("@")
        decodes, chunks = head.split(":")
        chunk, count = map(int, chunks.split("x"))
        ids, positions, caches, meta = step(model, int(decodes), chunk, count, int(ctx or chunk))

        def c_way():
            model.decode_step = c_step
            return model.forward(ids, positions, caches, meta)

        def ops_way():
            model.decode_step = None
            return model.forward(ids, positions, caches, meta)

        diff = (c_way() - ops_way()).abs().max().item()
        ratio, ops_s, c_s = paired_ratio(ops_way, c_way, args.budget_s)
        model.decode_step = c_step
        print(f"{shape:>14} {c_s * 1e3:10.1f} {ops_s * 1e3:8.1f} {ratio:6.2f} "
              f"{diff:10.2e}")


if __name__ == "__main__":
    main()
