#!/usr/bin/env python3
"""Prefill's matmuls against the machine (issue 47): q_linear on SmolLM2-135M's shapes at M = 1,
8, 32, 128, 512 rows, three ways side by side, then a whole 512-token prefill step.

    .venv/bin/python scripts/q_linear_prefill_bench.py --threads 1

Ways: c (csrc/quant_ops.c: the GEMV below 6 rows, the register-blocked GEMM above, weights
unpacked a tile at a time), sgemm (torch.mm on the float32 matrix dequantized once, ahead:
MKL/oneDNN with no dequantizing at all, the ceiling for float32), mm (custom_ops.q_linear_mm:
the blocks dequantized into a scratch matrix on every call, then torch.mm) and bf16 (the same in
bfloat16: opt-in, other numbers). Each pair is timed
in alternation (paired_timing.py): the ratios hold on a loaded machine, the GFLOP/s (best of the
rounds' medians) only on a quiet one, so the load average is printed. The fp32 peak is measured
by a C loop of independent vector FMAs (compiled here with -march=native) on one core.
The step: 8 prompts of 64 tokens in one forward (the model runner's path, no logits), with
q_linear's prefill choice set to c, mm and bf16 in turn.
"""

import argparse
import os
import subprocess
import tempfile
import time

import numpy as np
import torch
from gguf import GGMLQuantizationType as T
from gguf.quants import quantize

from minivllm.model import custom_ops, op_choice
from minivllm.model.paired_timing import paired_ratio
from minivllm.model.quant_linear import QuantWeight, repack

SHAPES = [("qkv", 960, 576, T.Q4_1), ("o", 576, 576, T.Q4_1), ("gate_up", 3072, 576, T.Q4_1),
          ("down", 576, 1536, T.Q4_1), ("head", 49152, 576, T.Q8_0)]  # fused, as the model runs
PEAK_C = r"""
#include <immintrin.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#if defined(__AVX512F__)
typedef __m512 v;
#define SET _mm512_set1_ps
#define FMA _mm512_fmadd_ps
#else
typedef __m256 v;
#define SET _mm256_set1_ps
#define FMA _mm256_fmadd_ps
#endif
#define STEP(a) a = FMA(a, x, y)
int main(void) {  /* 10 independent chains of vector FMAs: the core's FMA throughput */
    const long n = 100000; double best = 1e9; float sink = 0;
    for (int r = 0; r < 300; r++) {
        v x = SET(0.5f), y = SET(0.25f), a0 = SET(0), a1 = SET(1), a2 = SET(2), a3 = SET(3),
          a4 = SET(4), a5 = SET(5), a6 = SET(6), a7 = SET(7), a8 = SET(8), a9 = SET(9);
        struct timespec t0, t1; clock_gettime(CLOCK_MONOTONIC, &t0);
        for (long i = 0; i < n; i++) {
            __asm__ volatile("" : "+x"(x), "+x"(y));  /* opaque: nothing folds */
            STEP(a0); STEP(a1); STEP(a2); STEP(a3); STEP(a4);
            STEP(a5); STEP(a6); STEP(a7); STEP(a8); STEP(a9);
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double s = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
        if (s < best) best = s;
        v t = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9;
        float o[sizeof(v) / 4]; memcpy(o, &t, sizeof(o)); sink += o[0];
    }
    printf("%.1f %g\n", n * 10.0 * 2 * (sizeof(v) / 4) / best / 1e9, sink);
}
"""


def fp32_peak() -> str:
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = os.path.join(tmp, "peak.c"), os.path.join(tmp, "peak")
        with open(src, "w") as f:
            f.write(PEAK_C)
        subprocess.run(["gcc", "-O2", "-march=native", src, "-o", exe], check=True)
        gflops = max(float(subprocess.run([exe], capture_output=True, text=True,
                                          check=True).stdout.split()[0]) for _ in range(3))
    return f"{gflops:.0f} GFLOP/s a core ({gflops * os.cpu_count():.0f} for {os.cpu_count()})"


def weight(n: int, k: int, qtype) -> QuantWeight:
    w = np.random.default_rng(0).standard_normal((n, k), np.float32) / 24
    return repack(QuantWeight(torch.from_numpy(quantize(w, qtype).copy()), qtype, k))


def kernel_table(rows: list[int], budget_s: float) -> None:
    print(f"{'shape':>8} {'M':>4} | {'c ms':>8} {'GF/s':>5} | {'sgemm ms':>8} {'GF/s':>5} | "
          f"{'mm ms':>8} {'GF/s':>5} | {'bf16 ms':>8} {'GF/s':>5} | c/sgemm  c/mm  c/bf16")
    for name, n, k, qtype in SHAPES:
        w = weight(n, k, qtype)
        wf = w.float() if n * k <= custom_ops.MM_MAX_WEIGHTS else None
        for m in rows:
            x = torch.randn(m, k)
            flops = 2 * m * n * k
            c = lambda: custom_ops.q_linear_c(x, w)  # noqa: E731
            if wf is None:  # the head: 113 MB of floats, past q_linear_mm's limit
                _, c_s, _ = paired_ratio(c, c, budget_s)
                print(f"{name:>8} {m:4d} | {c_s * 1e3:8.3f} {flops / c_s / 1e9:5.1f} |")
                continue
            r_sgemm, c_s, s_s = paired_ratio(c, lambda: x @ wf.t(), budget_s)
            r_mm, _, mm_s = paired_ratio(c, lambda: custom_ops.q_linear_mm(x, w), budget_s)
            r_bf, _, bf_s = paired_ratio(c, lambda: custom_ops.q_linear_mm(x, w, bf16=True),
                                         budget_s)
            print(f"{name:>8} {m:4d} | {c_s * 1e3:8.3f} {flops / c_s / 1e9:5.1f} | "
                  f"{s_s * 1e3:8.3f} {flops / s_s / 1e9:5.1f} | {mm_s * 1e3:8.3f} "
                  f"{flops / mm_s / 1e9:5.1f} | {bf_s * 1e3:8.3f} {flops / bf_s / 1e9:5.1f} | "
                  f"{r_sgemm:6.2f} {r_mm:5.2f} {r_bf:6.2f}")


def prefill_step(rounds: int) -> None:
    from minivllm.engine.config import EngineConfig
    from minivllm.model.attention import AttentionMetadata, PrefillChunk
    from minivllm.worker.model_runner import ModelRunner
    runner = ModelRunner(EngineConfig(kv_cache_dtype="float16"))
    runner.load_model()
    model, seqs, length, bs = runner.model, 8, 64, 16
    kv = model.allocate_kv_cache(seqs * length // bs, bs)
    ids, positions = torch.randint(0, 49152, (seqs * length,)), torch.arange(length).repeat(seqs)
    meta = AttentionMetadata(slot_mapping=torch.arange(seqs * length), prefills=[
        PrefillChunk(i * length, (i + 1) * length, length,
                     torch.arange(i * length // bs, (i + 1) * length // bs)) for i in range(seqs)])
    base = op_choice.table()
    times: dict[str, list[float]] = {"c": [], "mm": [], "bf16": []}
    for _ in range(rounds):
        for way in times:
            op_choice.set_table({**base, "q_linear/prefill": way})
            start = time.perf_counter()
            model.forward(ids, positions, kv, meta)
            times[way].append(time.perf_counter() - start)
    op_choice.set_table(base)
    for way, ts in times.items():
        ratios = [c / t for c, t in zip(times["c"], ts)]
        print(f"512-token prefill step, q_linear {way:>4}: median {np.median(ts) * 1e3:.0f} ms, "
              f"{np.median(ts) / 512 * 1e3:.2f} ms a prompt token; c/{way} per round: median "
              f"{np.median(ratios):.2f} ({', '.join(f'{r:.2f}' for r in ratios)})")


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32, 128, 512])
    ap.add_argument("--budget-s", type=float, default=0.3, help="per pair of ways")
    ap.add_argument("--step-rounds", type=int, default=5, help="0: no whole step")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"threads {args.threads}, load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} "
          f"CPUs; fp32 FMA peak {fp32_peak()}")
    kernel_table(args.rows, args.budget_s)
    if args.step_rounds:
        prefill_step(args.step_rounds)
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
