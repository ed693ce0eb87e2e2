"""The server's Prometheus metrics, named as vLLM names them with a `minivllm:` prefix.

Gauges (requests running and waiting, KV-cache blocks) are read from the engine core when
/metrics is scraped (AsyncLLM.get_stats); counters and histograms are updated by the API server
as outputs arrive. Tokens are counted as they arrive, so an aborted request's count too; every
request that ends is counted once by how it ended (request_success_total{finished_reason}:
stop, length, abort for a client that left, error). In vLLM: PrometheusStatLogger.__init__ in
vllm/v1/metrics/loggers.py (num_requests_running, kv_cache_usage_perc, prompt and generation
tokens, request_success by finished_reason, the TTFT, inter-token latency and e2e histograms;
e2e here only for requests the engine finished).

Several API servers (`serve --api-server-count N`) answer /metrics in turn, so each must report
the sum over all of them: the launcher sets MULTIPROC_ENV to a folder before it starts them
(shared_metrics_dir), every process writes its values to files there (prometheus_client's
multiprocess mode), and a scrape adds them up. Counters and histograms sum; the engine gauges
take the most recent value. vLLM does the same: setup_multiprocess_prometheus in
vllm/v1/metrics/prometheus.py.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator

from prometheus_client import (CollectorRegistry, Counter, Gauge, Histogram,
                               disable_created_metrics, generate_latest, multiprocess)

from minivllm.utils.run_dir import run_dir

disable_created_metrics()  # no `_created` timestamp series next to every counter
# prometheus_client's own variable; read when it is imported, so set it before a process starts.
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


@contextlib.contextmanager
def shared_metrics_dir() -> Iterator[str]:
    """The folder where the API servers started inside the block write their values: the
    user's own MULTIPROC_ENV, left as it is; or a private folder, which the variable names
    during the block and which is removed after it."""
    if user_dir := os.environ.get(MULTIPROC_ENV):
        yield user_dir
        return
    # Inside the run's folder: if the launcher is killed, whoever removes its run folder (its
    # last child at exit, or the next run's sweep: utils/run_dir.py) removes this one too.
    path = tempfile.mkdtemp(prefix="metrics-", dir=run_dir())
    os.environ[MULTIPROC_ENV] = path
    try:
        yield path
    finally:
        os.environ.pop(MULTIPROC_ENV, None)
        shutil.rmtree(path, ignore_errors=True)


TTFT_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                10.0, 20.0, 40.0, 80.0)
ITL_BUCKETS = (0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
               0.4, 0.5, 0.75, 1.0, 2.5)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
               120.0)


FINISHED_REASONS = ("stop", "length", "abort", "error")  # vLLM's FinishReason, minus repetition


class ServerMetrics:
    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        labels, self.labels = ["model_name"], {"model_name": model_name}

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(f"minivllm:{name}", doc, labels, registry=self.registry,
                         multiprocess_mode="mostrecent").labels(**self.labels)
        self.running = gauge("num_requests_running", "Requests in the engine's running batch.")
        self.waiting = gauge("num_requests_waiting", "Requests waiting to be scheduled.")
        self.kv_usage = gauge("kv_cache_usage_perc", "Fraction of KV-cache blocks in use (0-1).")
        self.kv_used = gauge("kv_cache_blocks_used", "KV-cache blocks in use.")
        self.kv_total = gauge("kv_cache_blocks_total", "KV-cache blocks in all.")
        # vLLM's counter vllm:num_preemptions (vllm/v1/metrics/loggers.py:739); here the
        # engines' own running count, read at a scrape, so a gauge that every API server
        # reports alike rather than a counter each would add to
        self.preemptions = gauge("num_preemptions_total", "Requests preempted so far (their "
                                 "blocks freed for others; they run their prompt again).")
        self.prompt_tokens = Counter("minivllm:prompt_tokens", "Prompt tokens processed.", labels,
                                     registry=self.registry).labels(**self.labels)
        self.generation_tokens = Counter("minivllm:generation_tokens", "Tokens generated.",
                                         labels, registry=self.registry).labels(**self.labels)
        self.request_success = Counter(
            "minivllm:request_success", "Requests that ended, by how: stop, length, abort "
            "(the client left) or error.", labels + ["finished_reason"], registry=self.registry)
        for reason in FINISHED_REASONS:  # every series exists from the start, at 0
            self.request_success.labels(**self.labels, finished_reason=reason)
        self.ttft = Histogram("minivllm:time_to_first_token_seconds", "Time to first token.",
                              labels, buckets=TTFT_BUCKETS, registry=self.registry
                              ).labels(**self.labels)
        self.itl = Histogram("minivllm:inter_token_latency_seconds", "Time between tokens.",
                             labels, buckets=ITL_BUCKETS, registry=self.registry
                             ).labels(**self.labels)
        self.e2e = Histogram("minivllm:e2e_request_latency_seconds", "Request latency.",
                             labels, buckets=E2E_BUCKETS, registry=self.registry
                             ).labels(**self.labels)

    def observe_tokens(self, prompt_tokens: int, since_last: float, since_start: float,
                       num_new: int) -> None:
        """New tokens of one request; `prompt_tokens` with its first ones (the prefill is
        done), else 0."""
        self.generation_tokens.inc(num_new)
        if prompt_tokens:
            self.prompt_tokens.inc(prompt_tokens)
            self.ttft.observe(since_start)
            # More tokens in the first output (a late read) came with the first, as a
            # client sees them: a gap of 0 each, so every token but the first has an ITL.
            gaps = [0.0] * (num_new - 1)
        else:  # several tokens in one output (a stop string, a late read): split the gap
            gaps = [since_last / num_new] * num_new
        for gap in gaps:
            self.itl.observe(gap)

    def observe_finished(self, e2e: float) -> None:
        self.e2e.observe(e2e)

    def observe_ended(self, finished_reason: str) -> None:
        self.request_success.labels(**self.labels, finished_reason=finished_reason).inc()

    def update_engine_stats(self, stats: dict) -> None:
        self.running.set(stats.get("num_running", 0))
        self.waiting.set(stats.get("num_waiting", 0))
        used, total = stats.get("kv_blocks_used", 0), stats.get("kv_blocks_total", 0)
        self.kv_used.set(used)
        self.kv_total.set(total)
        self.kv_usage.set(used / total if total else 0.0)
        self.preemptions.set(stats.get("num_preemptions", 0))

    def render(self) -> bytes:
        if not os.environ.get(MULTIPROC_ENV):
            return generate_latest(self.registry)
        merged = CollectorRegistry()  # every API server's values, summed, at each scrape
        multiprocess.MultiProcessCollector(merged)
        return generate_latest(merged)
