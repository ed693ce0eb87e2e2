#!/usr/bin/env python3
"""The table of scripts/side_by_side.sh OUTDIR: per server, the median over the rounds (the
range in brackets) of c32 tok/s, c32 TTFT p50, c32 ITL p50 and p99, c1 tok/s and c1 ITL p99; a
line per goal of minivllm against llama.cpp's best file (the highest c32 tok/s), met or not,
with the numbers; then every column of every run.

    scripts/side_by_side_table.py OUTDIR
"""

import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

SUMMARY = [(32, "out_tok_per_s", "c32 tok/s", 1), (32, "ttft_p50_ms", "c32 TTFT p50 ms", 0),
           (32, "itl_p50_ms", "c32 ITL p50 ms", 1), (32, "itl_p99_ms", "c32 ITL p99 ms", 1),
           (1, "out_tok_per_s", "c1 tok/s", 1), (1, "itl_p99_ms", "c1 ITL p99 ms", 1)]
COLUMNS = [("out_tok_per_s", "out tok/s"), ("ttft_p50_ms", "TTFT p50 ms"),
           ("tpot_p50_ms", "TPOT p50 ms"), ("itl_p50_ms", "ITL p50 ms"),
           ("itl_p90_ms", "ITL p90 ms"), ("itl_p99_ms", "ITL p99 ms"),
           ("cpu_ms_per_tok", "server CPU ms/tok"), ("server_rss_mib", "server RSS MiB")]
# (what, streams, metric, factor, sense): minivllm's median against factor x the best file's
GOALS = [("c32 ITL p99", 32, "itl_p99_ms", 1.0, "<="),
         ("c32 tok/s", 32, "out_tok_per_s", 1.2, ">="),
         ("c1 tok/s", 1, "out_tok_per_s", 1.0, ">="),
         ("c32 TTFT p50", 32, "ttft_p50_ms", 1.0, "<=")]


def load(out: Path) -> dict:
    runs = defaultdict(dict)  # (label, streams) -> round -> result
    for f in out.glob("r*-c*.json"):
        round_ = int(re.match(r"r(\d+)-", f.name).group(1))
        for r in json.loads(f.read_text())["results"]:
            runs[r["engine"], r["concurrency"]][round_] = r
    return runs


def values(runs: dict, label: str, c: int, key: str) -> list[float]:
    return [r[key] for r in runs.get((label, c), {}).values() if key in r]


def cell(vals: list[float], digits: int = 1) -> str:
    if not vals:
        return "-"
    mid = f"{statistics.median(vals):,.{digits}f}"
    return mid if len(vals) == 1 else f"{mid} ({min(vals):,.{digits}f}-{max(vals):,.{digits}f})"


def summary(runs: dict, labels: list[str]) -> None:
    print("| server | rounds | " + " | ".join(name for *_, name, _ in SUMMARY) + " |")
    print("|---|---|" + "---|" * len(SUMMARY))
    for label in labels:
        rounds = len(runs.get((label, 32), {}))
        cells = [cell(values(runs, label, c, key), d) for c, key, _, d in SUMMARY]
        print(f"| {label} | {rounds} | " + " | ".join(cells) + " |")


def goals(runs: dict, labels: list[str], mine: str = "minivllm") -> None:
    def median(label, c, key):
        vals = values(runs, label, c, key)
        return statistics.median(vals) if vals else None
    llamas = [lb for lb in labels if lb.startswith("llama") and median(lb, 32, "out_tok_per_s")]
    if median(mine, 32, "out_tok_per_s") is None or not llamas:
        print(f"goals: need runs of {mine} and of a llama.cpp server at 32 streams")
        return
    best = max(llamas, key=lambda lb: median(lb, 32, "out_tok_per_s"))
    print(f"goals, medians of the rounds, against llama.cpp's best file by c32 tok/s: {best}")
    for what, c, key, factor, sense in GOALS:
        ours, theirs = median(mine, c, key), median(best, c, key)
        if ours is None or theirs is None:
            print(f"  {what}: not measured")
            continue
        met = ours <= factor * theirs if sense == "<=" else ours >= factor * theirs
        need = f"{factor:g}x {theirs:,.1f}" if factor != 1 else f"{theirs:,.1f}"
        print(f"  {what} {sense} {need}: {'met' if met else 'NOT met'} "
              f"({mine} {ours:,.1f}, {ours / theirs:.2f}x {best}'s)")


def full_table(runs: dict) -> None:
    print("| server | streams | rounds | " + " | ".join(name for _, name in COLUMNS) + " |")
    print("|---|---|---|" + "---|" * len(COLUMNS))
    for (label, c), rounds in sorted(runs.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        cells = [cell([r[key] for r in rounds.values()]) if all(key in r for r in rounds.values())
                 else "-" for key, _ in COLUMNS]
        print(f"| {label} | {c} | {len(rounds)} | " + " | ".join(cells) + " |")


def main(out: Path) -> None:
    runs = load(out)
    labels = sorted({label for label, _ in runs}, key=lambda lb: (lb.startswith("llama"), lb))
    summary(runs, labels)
    for mine in (lb for lb in labels if lb.startswith("minivllm")):  # each minivllm server
        print()
        goals(runs, labels, mine)
    print()
    full_table(runs)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
