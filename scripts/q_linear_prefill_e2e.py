#!/usr/bin/env python3
"""q_linear's prefill way end to end (issue 47): one in-process engine (EngineCore +
OutputProcessor, no HTTP) at concurrency 32 with 64-token prompts, the way of its prefill matmuls
(op_choice "q_linear/prefill": c, mm or the opt-in bf16) switched between runs, the ways
alternated round by round so that the machine's load hits each alike.

    .venv/bin/python scripts/q_linear_prefill_e2e.py --rounds 3 --ways c bf16

Per run: tok/s, TTFT p50, ITL p50/p99, the steps' execute-time fit (fixed, per decode, per prompt
token: scripts/side_by_side_steps.py), the median step with a full prompt chunk, and the load
the LoadMeter saw from other programs; then each way's medians and their ratios to the first way's.
"""

import argparse

import numpy as np
from side_by_side_steps import record_steps, step_summary

from minivllm.bench.load import LoadMeter
from minivllm.bench.serve import InprocEngine, random_prompts, run_inproc, summarize
from minivllm.engine.config import EngineConfig
from minivllm.model import op_choice

KEYS = ("out_tok_per_s", "ttft_p50_ms", "itl_p50_ms", "itl_p99_ms", "per_prompt_token_ms",
        "chunk_step_ms")


def one_run(engine: InprocEngine, way: str, base: dict, prompts, args) -> dict:
    op_choice.set_table({**base, "q_linear/prefill": way})
    engine.core.reset_prefix_cache()  # every run computes its prompts
    log: list = []
    record_steps(engine.core, log)
    with LoadMeter() as load:
        results, wall = run_inproc(engine, prompts, args.output_len, args.concurrency)
    steps = step_summary(log)
    budget = engine.core.scheduler.config.max_num_batched_tokens
    chunk = [t for p, _, t in log if p >= 0.75 * budget]  # steps with a (nearly) full chunk
    row = {**summarize(way, args.concurrency, results, wall, None),
           "per_prompt_token_ms": steps["fit_ms"]["per_prompt_token"],
           "chunk_step_ms": 1e3 * float(np.median(chunk)) if chunk else float("nan"),
           "others_cores": load.others_cores()}
    print(f"{way:>4}: {row['out_tok_per_s']:6.1f} tok/s, TTFT p50 {row['ttft_p50_ms']:5.0f} ms, "
          f"ITL p50/p99 {row['itl_p50_ms']:4.0f}/{row['itl_p99_ms']:5.0f} ms, "
          f"{row['per_prompt_token_ms']:.2f} ms a prompt token (fit), full-chunk step "
          f"{row['chunk_step_ms']:.0f} ms; {load.describe(what='this run')}", flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ways", nargs="+", default=["c", "bf16"], choices=["c", "mm", "bf16"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--num-threads", type=int, default=1)
    args = ap.parse_args()
    c = args.concurrency
    config = EngineConfig(max_num_seqs=c, max_model_len=512, kv_cache_dtype="float16",
                          num_threads=args.num_threads)
    vocab = config.model_config.vocab_size
    prompts = random_prompts(args.num_prompts, args.input_len, vocab)
    engine = InprocEngine(config, c)
    base = op_choice.table()
    rows: dict[str, list[dict]] = {way: [] for way in args.ways}
    try:
        run_inproc(engine, random_prompts(c, args.input_len, vocab, seed=1), 8, c)  # warm-up
        for r in range(args.rounds):
            for way in args.ways if r % 2 == 0 else args.ways[::-1]:
                rows[way].append(one_run(engine, way, base, prompts, args))
    finally:
        op_choice.set_table(base)
        engine.close()
    first = args.ways[0]
    for way in args.ways:
        med = {k: float(np.median([row[k] for row in rows[way]])) for k in KEYS}
        ratio = {k: med[k] / float(np.median([row[k] for row in rows[first]])) for k in KEYS}
        print(f"median {way:>4}: " + ", ".join(f"{k} {med[k]:.2f} ({ratio[k]:.2f}x {first})"
                                               for k in KEYS))


if __name__ == "__main__":
    main()
