"""`minivllm bench serve`: load-test an OpenAI-compatible server; by default `minivllm serve`
against the same engine in this process.

    minivllm bench serve --max-concurrency 1 8 32 --num-prompts 64 --random-input-len 128 \\
        --random-output-len 64 --json serve.json
    minivllm bench serve --backend openai --base-url http://127.0.0.1:8080 --max-concurrency 1 32

Like `vllm bench serve` (vllm/benchmarks/serve.py) with its random dataset: random token-id
prompts, a fixed output length (ignore_eos), and a closed loop that keeps `max-concurrency`
streaming requests in flight. Per request it records TTFT (send to first token), the gaps between
tokens (ITL), TPOT ((end-to-end - TTFT) / (tokens - 1)) and the end-to-end time; per run,
requests/s and output tokens/s, with the mean and the p50, p90 and p99 of each latency
(--metric-percentiles, vLLM's flag: vllm/benchmarks/serve.py:1859-1866). --goodput takes
service level objectives as vLLM's does (serve.py:1514-1549, 1868-1877): `ttft:500 tpot:100`
(milliseconds; names ttft, tpot, e2el) counts the requests that met all of them
(serve.py:669-692) and reports them per second (request_goodput, serve.py:779). The warm-up
requests use other prompts than the measured ones, so no measured prompt is in the prefix
cache already (vLLM warms up with its first prompt only, serve.py:880-945).

Without --base-url it starts `minivllm serve` itself and then runs the same prompts through the
engine in this process (EngineCore + OutputProcessor, the same closed loop, no HTTP, no IPC): the
headline `serve_vs_inproc_cN` is the server's output tok/s over the in-process engine's, measured
in the same run. What the ratio misses is what the server costs: HTTP, JSON, SSE, the engine core's
sockets, and the load generator itself, which shares the CPU; its CPU time is reported as
`client_cpu` (fraction of one core). With --base-url (vLLM's flag) the same client, prompts and
metrics go to any server that speaks /v1/completions with token-id prompts (vLLM, llama.cpp's
llama-server); --server-pid adds that server's CPU time per token and its memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time

import numpy as np

from minivllm.bench import _openai_client as client
from minivllm.bench._openai_client import Endpoint, RequestResult, first_model
from minivllm.bench.common import bench_parser, print_table, quick_mode, write_json
from minivllm.bench.load import LoadMeter, tree_cpu_s, tree_rss_mib
from minivllm.bench.serve_metrics import (DEFAULT_PERCENTILES, THROUGHPUT_COLUMNS,
                                          latency_columns, parse_goodput, summarize)
from minivllm.engine.config import KV_CACHE_DTYPES
from minivllm.entrypoints.openai.server_process import ServerProcess

SEED = 0
WARMUP_SEED = 1  # the warm-up's prompts: not the measured ones (the prefix cache would hold them)


def random_prompts(num: int, input_len: int, vocab_size: int,
                   seed: int = SEED) -> list[list[int]]:
    """vLLM's random dataset: uniform token ids (special tokens at the low ids are skipped)."""
    rng = np.random.default_rng(seed)
    low = min(1000, vocab_size // 4)
    return rng.integers(low, vocab_size, size=(num, input_len)).tolist()


async def run_load(host: str, port: int, prompts: list[list[int]], output_len: int,
                   concurrency: int, desc: str) -> tuple[list[RequestResult], float]:
    """The closed loop against a server at host:port with no model name (chapter 09's call)."""
    return await client.run_load(Endpoint(host, port), prompts, output_len, concurrency, desc)


class InprocEngine:
    """The engine in this process: EngineCore + OutputProcessor, no HTTP, no IPC."""

    def __init__(self, config, max_num_seqs: int) -> None:
        from minivllm.engine.core import EngineCore
        from minivllm.engine.output_processor import OutputProcessor
        from minivllm.tokenizer import Tokenizer
        self.core = EngineCore(config.replace(max_num_seqs=max_num_seqs))
        self.processor = OutputProcessor(Tokenizer.from_path(config.model))

    def close(self) -> None:
        self.core.shutdown()


def run_inproc(engine: InprocEngine, prompts: list[list[int]], output_len: int,
               concurrency: int) -> tuple[list[RequestResult], float]:
    """The server's closed loop, on the in-process engine: the baseline."""
    from minivllm.engine.messages import EngineCoreRequest
    from minivllm.sampling_params import SamplingParams

    core, processor = engine.core, engine.processor
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    results: dict[str, RequestResult] = {}
    sent: dict[str, float] = {}
    last: dict[str, float] = {}
    todo = list(enumerate(prompts))[::-1]
    in_flight = 0
    start = time.perf_counter()
    try:
        while todo or core.has_unfinished_requests():
            while todo and in_flight < concurrency:
                i, prompt = todo.pop()
                in_flight += 1
                rid = f"{id(prompts)}-{i}"
                ids = np.asarray(prompt, np.int32)
                core.add_request(EngineCoreRequest(rid, ids, params, arrival_time=time.time()))
                processor.add_request(rid, None, prompt, params)
                sent[rid] = time.perf_counter()
                results[rid] = RequestResult()
            updated, _ = processor.process_outputs(core.step())
            now = time.perf_counter()
            for out in updated:
                r = results[out.request_id]
                if r.ttft == 0.0:
                    r.ttft = now - sent[out.request_id]
                else:
                    r.itl.append(now - last[out.request_id])
                last[out.request_id] = now
                if out.finished:
                    in_flight -= 1
                    r.e2e = now - sent[out.request_id]
                    r.output_tokens = len(out.outputs[0].token_ids)
    finally:
        core.abort_requests(list(processor.request_states))
        processor.abort_requests(list(processor.request_states))
    return list(results.values()), time.perf_counter() - start



def warmup_prompts(prompts: list[list[int]], num: int, vocab_size: int) -> list[list[int]]:
    """num prompts shaped like the measured ones but not them (WARMUP_SEED)."""
    return random_prompts(num, len(prompts[0]) if prompts else 1, vocab_size, WARMUP_SEED)


def serve_run(endpoint: Endpoint, label: str, prompts: list[list[int]], output_len: int,
              concurrency: int, warmups: list[list[int]], server_pid: int | None,
              percentiles=DEFAULT_PERCENTILES, goodput: dict[str, float] | None = None) -> dict:
    """A warm-up, then one measured closed-loop run: its row."""
    if warmups:
        # First steps of each batch shape are slow (oneDNN primitives are created per shape,
        # KV-cache pages are touched for the first time).
        asyncio.run(client.run_load(endpoint, warmups, output_len, concurrency, "warm-up"))
    cpu0, server_cpu0 = time.process_time(), tree_cpu_s(server_pid)
    with LoadMeter() as load:
        results, wall = asyncio.run(client.run_load(endpoint, prompts, output_len, concurrency,
                                                    f"{label} c={concurrency}"))
    server_cpu = None if server_pid is None else tree_cpu_s(server_pid) - server_cpu0
    client_cpu = time.process_time() - cpu0
    row = summarize(label, concurrency, results, wall, server_cpu, client_cpu,
                    percentiles, goodput)
    if server_pid is not None:
        row["server_rss_mib"] = tree_rss_mib(server_pid)
        # what other programs took of the machine meanwhile (unknown without the server's CPU)
        row["others_cores"] = load.others_cores(client_cpu + server_cpu)
    for error in sorted({r.error for r in results if r.error})[:3]:
        print(f"c={concurrency}: a request failed: {error}", file=sys.stderr)
    return row


def make_parser():
    p = bench_parser("serve", __doc__)
    p.add_argument("--backend", choices=["openai"], default="openai",
                   help="the API the requests use: openai is /v1/completions (vLLM's default)")
    p.add_argument("--base-url", default=None,
                   help="load-test the server at this URL (http://HOST:PORT) instead of "
                        "starting `minivllm serve`")
    p.add_argument("--endpoint", default="/v1/completions", help="the API path under --base-url")
    p.add_argument("--served-model-name", default=None,
                   help="the model name sent with --base-url (default: the first of /v1/models)")
    p.add_argument("--label", default=None, help="the engine column's name for --base-url runs")
    p.add_argument("--server-pid", type=int, default=None,
                   help="with --base-url: the server's pid, to report its CPU per token and RSS")
    p.add_argument("--model", default=None,
                   help="the model whose vocabulary the prompts come from and that minivllm "
                        "serves without --base-url (default: the bundled SmolLM2-135M-Instruct)")
    p.add_argument("--max-concurrency", type=int, nargs="+", default=[32])
    p.add_argument("--num-prompts", type=int, default=None, help="default: 2 x max concurrency")
    p.add_argument("--num-warmups", type=int, default=None,
                   help="warm-up requests before each measured run (default: --num-prompts)")
    p.add_argument("--random-input-len", type=int, default=128)
    p.add_argument("--random-output-len", type=int, default=64)
    p.add_argument("--server-args", default="", help="extra `minivllm serve` flags, quoted")
    p.add_argument("--kv-cache-dtype", default="auto", choices=KV_CACHE_DTYPES,
                   help="the KV cache's element type, for the server and the in-process engine")
    p.add_argument("--metric-percentiles", default="50,90,99",
                   help="comma-separated percentiles of TTFT, TPOT and ITL to report "
                        "(vLLM's flag; its default is 99)")
    p.add_argument("--goodput", nargs="+", default=None, metavar="KEY:VALUE",
                   help="service level objectives in ms, e.g. ttft:2000 tpot:100 (names: "
                        "ttft, tpot, e2el): count the requests that met all of them, as "
                        "vLLM's --goodput")
    return p


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    try:
        args.percentiles = tuple(float(q) for q in args.metric_percentiles.split(","))
        args.slos = parse_goodput(args.goodput)
    except ValueError as e:
        raise SystemExit(f"minivllm bench serve: {e}") from None
    if not all(0 < q < 100 for q in args.percentiles):  # vLLM accepts (0, 100) too
        raise SystemExit("minivllm bench serve: --metric-percentiles must be in (0, 100)")
    if args.quick or quick_mode():
        args.random_input_len, args.random_output_len = 32, 16
    if args.server_pid is not None and args.base_url is None:
        raise SystemExit("minivllm bench serve: --server-pid goes with --base-url")
    from minivllm.model.config import load_config  # torch-free: the client need not load it
    from minivllm.model.paths import default_model_path
    model = args.model or default_model_path()
    vocab_size = load_config(model).vocab_size
    load = os.getloadavg()[0]
    target = args.base_url or f"minivllm serve {model}"
    print(f"minivllm bench serve: {target}; load average {load:.2f} on {os.cpu_count()} cores "
          f"(numbers are not to be trusted above ~1)")

    def prompts_for(c: int) -> list[list[int]]:
        return random_prompts(args.num_prompts or 2 * c, args.random_input_len, vocab_size)

    def warmups(c: int) -> list[list[int]]:
        num = len(prompts_for(c)) if args.num_warmups is None else args.num_warmups
        return warmup_prompts(prompts_for(c), num, vocab_size)
    if args.base_url is not None:
        rows, ratios = run_remote(args, prompts_for, warmups), {}
    else:
        rows, ratios = run_local(args, model, prompts_for, warmups)
    print_table(rows, [c for c in THROUGHPUT_COLUMNS if args.slos or "good" not in c])
    print_table(rows, latency_columns(args.percentiles))
    for name, value in ratios.items():
        print(f"{name} = {value:.3f}")
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    write_json(args.json, "serve", rows, ratios)
    return 0


def run_remote(args, prompts_for, warmups) -> list[dict]:
    """Every concurrency against the server at --base-url."""
    try:
        endpoint = Endpoint.from_url(args.base_url, args.endpoint)
        model = args.served_model_name or first_model(endpoint)
    except (ValueError, ConnectionError) as e:
        raise SystemExit(f"minivllm bench serve: {e}") from None
    endpoint = Endpoint(endpoint.host, endpoint.port, endpoint.path, model, endpoint.api_key)
    label = args.label or f"{args.backend}@{endpoint.host}:{endpoint.port}"
    return [serve_run(endpoint, label, prompts_for(c), args.random_output_len, c, warmups(c),
                      args.server_pid, args.percentiles, args.slos) for c in args.max_concurrency]


def local_configs(args, model: str) -> tuple[list[str], object]:
    """The server's flags, and the in-process engine's EngineConfig made from the same flags
    (--server-args included), so that both sides schedule alike."""
    from minivllm.entrypoints.serve import engine_config, make_parser
    flags = ["--kv-cache-dtype", args.kv_cache_dtype, *args.server_args.split()]
    config = engine_config(make_parser().parse_args([model, *flags]), headless=False)
    return [*([args.model] if args.model else []), *flags], config


def run_local(args, model: str, prompts_for, warmups) -> tuple[list[dict], dict]:
    """`minivllm serve` started here, then the same prompts on the in-process engine."""
    server_args, config = local_configs(args, model)
    rows, ratios = [], {}
    inproc_engine = InprocEngine(config, max(args.max_concurrency))
    with contextlib.closing(inproc_engine), ServerProcess(server_args) as server:
        endpoint = Endpoint("127.0.0.1", server.port)
        for c in args.max_concurrency:
            prompts = prompts_for(c)
            served = serve_run(endpoint, "serve", prompts, args.random_output_len, c,
                               warmups(c), server.pid, args.percentiles, args.slos)
            warm = warmups(c) or warmup_prompts(prompts, len(prompts),
                                                config.model_config.vocab_size)
            run_inproc(inproc_engine, warm, args.random_output_len, c)
            cpu0 = time.process_time()
            with LoadMeter() as load:
                results, wall = run_inproc(inproc_engine, prompts, args.random_output_len, c)
            cpu = time.process_time() - cpu0
            inproc = summarize("inproc", c, results, wall, cpu, None, args.percentiles, args.slos)
            inproc["others_cores"] = load.others_cores(cpu)
            rows += [served, inproc]
            if inproc["out_tok_per_s"] and served["cpu_ms_per_tok"]:
                ratios[f"serve_vs_inproc_c{c}"] = served["out_tok_per_s"] / inproc["out_tok_per_s"]
                # CPU per token, less sensitive to other programs' load than tok/s
                ratios[f"serve_vs_inproc_cpu_c{c}"] = (inproc["cpu_ms_per_tok"]
                                                       / served["cpu_ms_per_tok"])
    return rows, ratios


if __name__ == "__main__":
    sys.exit(main())
