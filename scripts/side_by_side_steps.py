#!/usr/bin/env python3
"""Where the inter-token tail at 32 streams comes from (issue 47), measured in-process with the
engine alone (EngineCore + OutputProcessor, no HTTP): every step's decodes, prompt tokens and
execute time, per scheduler variant, the variants alternated round by round.

    scripts/side_by_side_steps.py --rounds 2 --output-len 64 --json steps.json

Variants: b512 (the default budget), b128 (vLLM's knob: --max-num-batched-tokens 128) and
target (--target-itl-ms set each round to --factor x the median decode step b512 just took, so
the target follows the machine's load). Per run: tok/s, TTFT and ITL percentiles, CPU ms a token
(this process: steadier than tok/s on a shared machine), the steps and the steps that carried
prompt tokens, the share of the step-time p99 (weighted by the decodes each step delays) held by
steps with prompt tokens, a least-squares fit of execute time on decodes and prompt tokens, and
the LoadMeter's view of other programs.
"""

import argparse
import dataclasses
import json
import time

import numpy as np

from minivllm.bench.load import LoadMeter
from minivllm.bench.serve import InprocEngine, random_prompts, run_inproc, summarize
from minivllm.engine.config import EngineConfig

VARIANTS = {"b512": {}, "b128": {"max_num_batched_tokens": 128},
            "target": {"target_itl_ms": 1000.0}}  # target: reset each round (--factor)


def record_steps(core, log: list) -> None:
    """Append (prompt tokens, decodes, execute seconds) of every step to log."""
    executor = core.model_executor
    execute = type(executor).execute_model.__get__(executor)

    def timed(so):
        n = so.num_scheduled_tokens
        t0 = time.perf_counter()
        out = execute(so)
        log.append((int(n[n > 1].sum()), int((n == 1).sum()), time.perf_counter() - t0))
        return out
    executor.execute_model = timed


def step_summary(log: list) -> dict:
    p, d, t = np.array(log).T
    fit = np.linalg.lstsq(np.c_[np.ones(len(p)), d, p], t, rcond=None)[0]
    per_itl, prompt = np.repeat(t, d.astype(int)), np.repeat(p, d.astype(int))
    tail = per_itl >= np.percentile(per_itl, 99)
    decode = (p == 0) & (d >= 24)
    return {"steps": len(log), "prefill_steps": int((p > 0).sum()), "max_prefill": int(p.max()),
            "p99_held_by_prefill_steps": float((prompt[tail] > 0).mean()),
            "decode_step_ms": 1e3 * float(np.median(t[decode])) if decode.any() else None,
            "fit_ms": {"fixed": 1e3 * fit[0], "per_decode": 1e3 * fit[1],
                       "per_prompt_token": 1e3 * fit[2]}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--factor", type=float, default=1.5, help="target = factor x decode step")
    ap.add_argument("--num-threads", type=int, default=1,
                    help="1 keeps a loaded machine from stalling torch's thread barrier")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    c = args.concurrency
    config = EngineConfig(max_num_seqs=c, max_model_len=512, kv_cache_dtype="float16",
                          num_threads=args.num_threads)
    prompts = random_prompts(args.num_prompts, args.input_len, config.model_config.vocab_size)
    engines = {name: InprocEngine(config.replace(**kw), c) for name, kw in VARIANTS.items()}
    rows = []
    try:
        for engine in engines.values():  # first shapes are slow; other prompts than measured
            run_inproc(engine, random_prompts(c, args.input_len, config.model_config.vocab_size,
                                              seed=1), 8, c)
        for r in range(args.rounds):
            decode_ms = None
            for name, engine in engines.items():
                scheduler = engine.core.scheduler
                if name == "target" and decode_ms:
                    scheduler.config = dataclasses.replace(scheduler.config,
                                                           target_itl_ms=args.factor * decode_ms)
                engine.core.reset_prefix_cache()  # every run computes its prompts
                log: list = []
                record_steps(engine.core, log)
                with LoadMeter() as load:
                    results, wall = run_inproc(engine, prompts, args.output_len, c)
                row = {**summarize(name, c, results, wall, None), "round": r,
                       **step_summary(log), "target_itl_ms": scheduler.config.target_itl_ms,
                       "cpu_ms_per_tok": 1e3 * load.own_cpu_s / sum(q.output_tokens
                                                                     for q in results),
                       "others_cores": load.others_cores(), "quiet": load.quiet()}
                decode_ms = decode_ms or row["decode_step_ms"]
                rows.append(row)
                print(f"r{r} {name:6s} {row['out_tok_per_s']:6.1f} tok/s, CPU "
                      f"{row['cpu_ms_per_tok']:.1f} ms/tok, TTFT p50 {row['ttft_p50_ms']:5.0f}, "
                      f"ITL p50/p90/p99 {row['itl_p50_ms']:4.0f}/{row['itl_p90_ms']:4.0f}/"
                      f"{row['itl_p99_ms']:5.0f} ms; {row['steps']} steps, "
                      f"{row['prefill_steps']} with prompts (max {row['max_prefill']}); p99 held "
                      f"by them {row['p99_held_by_prefill_steps']:.2f}; "
                      f"{load.describe(what='this run')}", flush=True)
    finally:
        for engine in engines.values():
            engine.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
