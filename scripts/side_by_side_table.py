#!/usr/bin/env python3
"""The table of scripts/side_by_side.sh OUTDIR: per server and stream count, the median over the
rounds with the range in brackets, then minivllm against llama.cpp round by round."""

import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

COLUMNS = [("out_tok_per_s", "out tok/s"), ("ttft_p50_ms", "TTFT p50 ms"),
           ("tpot_p50_ms", "TPOT p50 ms"), ("itl_p50_ms", "ITL p50 ms"),
           ("itl_p90_ms", "ITL p90 ms"), ("itl_p99_ms", "ITL p99 ms"),
           ("cpu_ms_per_tok", "server CPU ms/tok"), ("server_rss_mib", "server RSS MiB")]
PAIRS = [("minivllm", "llama"), ("minivllm-180M", "llama"), ("minivllm-180M", "llama-unified-8k"),
         ("minivllm-itl", "llama")]


def load(out: Path) -> dict:
    runs = defaultdict(dict)  # (label, streams) -> round -> result
    for f in out.glob("r*-c*.json"):
        round_ = int(re.match(r"r(\d+)-", f.name).group(1))
        for r in json.loads(f.read_text())["results"]:
            runs[r["engine"], r["concurrency"]][round_] = r
    return runs


def cell(values: list[float]) -> str:
    mid = f"{statistics.median(values):.1f}"
    return mid if len(values) == 1 else f"{mid} ({min(values):.1f}-{max(values):.1f})"


def main(out: Path) -> None:
    runs = load(out)
    print("| server | streams | rounds | " + " | ".join(name for _, name in COLUMNS) + " |")
    print("|---|---|---|" + "---|" * len(COLUMNS))
    for (label, c), rounds in sorted(runs.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        cells = [cell([r[key] for r in rounds.values()]) if all(key in r for r in rounds.values())
                 else "-" for key, _ in COLUMNS]  # runs from before p90 have no ITL p90
        print(f"| {label} | {c} | {len(rounds)} | " + " | ".join(cells) + " |")
    for (a, b), c in [(pair, c) for pair in PAIRS for c in (1, 32)]:
        mine, theirs = runs.get((a, c), {}), runs.get((b, c), {})
        both = sorted(set(mine) & set(theirs))
        if both:
            tok = [mine[i]["out_tok_per_s"] / theirs[i]["out_tok_per_s"] for i in both]
            rss = [mine[i]["server_rss_mib"] / theirs[i]["server_rss_mib"] for i in both]
            itl = [mine[i]["itl_p99_ms"] / theirs[i]["itl_p99_ms"] for i in both]
            print(f"{c} streams, {a} / {b}: out tok/s {', '.join(f'{x:.2f}' for x in tok)} "
                  f"(median {statistics.median(tok):.2f}); ITL p99 median "
                  f"{statistics.median(itl):.2f}; RSS median {statistics.median(rss):.2f}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
