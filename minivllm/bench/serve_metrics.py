"""The numbers of `minivllm bench serve`: one row per run, from the requests' timings.

As vLLM's calculate_metrics (vllm/benchmarks/serve.py:600-790): throughput, the mean and chosen
percentiles of TTFT, TPOT and ITL, and with service level objectives (--goodput) the requests
that met every one of them.
"""

from __future__ import annotations

from minivllm.bench._openai_client import RequestResult
from minivllm.bench.common import percentile

DEFAULT_PERCENTILES = (50.0, 90.0, 99.0)
GOODPUT_METRICS = ("ttft", "tpot", "e2el")  # vLLM's VALID_NAMES (serve.py:1517)

THROUGHPUT_COLUMNS = ["engine", "concurrency", "requests", "errors", "req_per_s", "out_tok_per_s",
                      "good_requests", "goodput_req_per_s", "e2e_p50_s", "cpu_ms_per_tok",
                      "client_cpu", "server_rss_mib", "others_cores"]


def _name(q: float) -> str:
    return f"p{q:g}".replace(".", "_")  # 99.9 -> p99_9


def latency_columns(percentiles=DEFAULT_PERCENTILES) -> list[str]:
    return ["engine", "concurrency"] + [f"{m}_{s}_ms" for m in ("ttft", "tpot", "itl")
                                       for s in ("mean", *map(_name, percentiles))]



def _stats(name: str, values: list[float], percentiles=DEFAULT_PERCENTILES) -> dict[str, float]:
    """Mean and percentiles in milliseconds (zeros when there is nothing to measure)."""
    if not values:
        return {f"{name}_{s}_ms": 0.0 for s in ("mean", *map(_name, percentiles))}
    return {f"{name}_mean_ms": 1e3 * sum(values) / len(values),
            **{f"{name}_{_name(q)}_ms": 1e3 * percentile(values, q) for q in percentiles}}


def parse_goodput(pairs: list[str] | None) -> dict[str, float]:
    """`ttft:500 tpot:100` -> {"ttft": 500.0, "tpot": 100.0} (milliseconds), checked as vLLM
    checks them (check_goodput_args, serve.py:1514-1533)."""
    slos = {}
    for pair in pairs or []:
        name, _, value = pair.partition(":")
        try:
            slos[name] = float(value)
        except ValueError:
            raise ValueError(f"--goodput takes KEY:VALUE pairs, the value in milliseconds; got "
                             f"{pair!r}") from None
        if name not in GOODPUT_METRICS:
            raise ValueError(f"--goodput: unknown metric {name!r}; use {', '.join(GOODPUT_METRICS)}")
        if slos[name] < 0:
            raise ValueError(f"--goodput: {name} must be non-negative, got {value}")
    return slos


def is_good(r: RequestResult, slos: dict[str, float]) -> bool:
    """Met every objective (vLLM: a TPOT of 0 for a one-token answer, serve.py:656-660)."""
    got = {"ttft": r.ttft, "tpot": r.tpot or 0.0, "e2el": r.e2e}
    return all(1e3 * got[name] <= limit for name, limit in slos.items())


def summarize(kind: str, concurrency: int, results: list[RequestResult], wall: float,
              cpu_s: float | None, client_cpu_s: float | None = None,
              percentiles=DEFAULT_PERCENTILES, goodput: dict[str, float] | None = None) -> dict:
    """One row. cpu_s: CPU seconds the engine's processes used (the server's whole process tree,
    or this process for the in-process engine; None: unknown); client_cpu_s: the load
    generator's; goodput: the objectives of parse_goodput (none: no goodput columns)."""
    ok = [r for r in results if r.error is None]
    tokens = sum(r.output_tokens for r in ok)
    row = {"engine": kind, "concurrency": concurrency, "requests": len(ok),
           "errors": len(results) - len(ok), "req_per_s": len(ok) / wall,
           "out_tok_per_s": tokens / wall,
           **_stats("ttft", [r.ttft for r in ok], percentiles),
           **_stats("tpot", [r.tpot for r in ok if r.tpot is not None], percentiles),
           **_stats("itl", [x for r in ok for x in r.itl], percentiles),
           "e2e_p50_s": percentile([r.e2e for r in ok], 50) if ok else 0.0}
    if goodput:
        row["good_requests"] = sum(is_good(r, goodput) for r in ok)
        row["goodput_req_per_s"] = row["good_requests"] / wall
    if cpu_s is not None:
        row["cpu_ms_per_tok"] = 1e3 * cpu_s / tokens if tokens else 0.0
    if client_cpu_s is not None:
        row["client_cpu"] = client_cpu_s / wall  # cores the load generator kept busy
    return row
