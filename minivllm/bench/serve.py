"""`minivllm bench serve`: load-test an OpenAI-compatible server; by default `minivllm serve`
against the same engine in this process.

    minivllm bench serve --max-concurrency 1 8 32 --num-prompts 64 --random-input-len 128 \\
        --random-output-len 64 --json serve.json
    minivllm bench serve --backend openai --base-url http://127.0.0.1:8080 --max-concurrency 1 32

Like `vllm bench serve` (vllm/benchmarks/serve.py) with its random dataset: random token-id
prompts, a fixed output length (ignore_eos), and a closed loop that keeps `max-concurrency`
streaming requests in flight. Per request it records TTFT (send to first token), the gaps between
tokens (ITL), TPOT ((end-to-end - TTFT) / (tokens - 1)) and the end-to-end time; per run,
requests/s and output tokens/s, with the mean, median and p99 of each latency.

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
from minivllm.bench.common import bench_parser, percentile, print_table, quick_mode, write_json
from minivllm.bench.load import tree_cpu_s, tree_rss_mib
from minivllm.engine.config import KV_CACHE_DTYPES
from minivllm.entrypoints.openai.server_process import ServerProcess

SEED = 0


def random_prompts(num: int, input_len: int, vocab_size: int) -> list[list[int]]:
    """vLLM's random dataset: uniform token ids (special tokens at the low ids are skipped)."""
    rng = np.random.default_rng(SEED)
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



THROUGHPUT_COLUMNS = ["engine", "concurrency", "requests", "errors", "req_per_s", "out_tok_per_s",
                      "e2e_p50_s", "cpu_ms_per_tok", "client_cpu", "server_rss_mib"]
LATENCY_COLUMNS = ["engine", "concurrency"] + [f"{m}_{s}_ms" for m in ("ttft", "tpot", "itl")
                                               for s in ("mean", "p50", "p99")]


def _stats(name: str, values: list[float]) -> dict[str, float]:
    """Mean, median and p99 in milliseconds (zeros when there is nothing to measure)."""
    if not values:
        return {f"{name}_{s}_ms": 0.0 for s in ("mean", "p50", "p99")}
    return {f"{name}_mean_ms": 1e3 * sum(values) / len(values),
            f"{name}_p50_ms": 1e3 * percentile(values, 50),
            f"{name}_p99_ms": 1e3 * percentile(values, 99)}


def summarize(kind: str, concurrency: int, results: list[RequestResult], wall: float,
              cpu_s: float | None, client_cpu_s: float | None = None) -> dict:
    """One row. cpu_s: CPU seconds the engine's processes used (the server's whole process tree,
    or this process for the in-process engine; None: unknown); client_cpu_s: the load
    generator's."""
    ok = [r for r in results if r.error is None]
    tokens = sum(r.output_tokens for r in ok)
    row = {"engine": kind, "concurrency": concurrency, "requests": len(ok),
           "errors": len(results) - len(ok), "req_per_s": len(ok) / wall,
           "out_tok_per_s": tokens / wall,
           **_stats("ttft", [r.ttft for r in ok]),
           **_stats("tpot", [r.tpot for r in ok if r.tpot is not None]),
           **_stats("itl", [x for r in ok for x in r.itl]),
           "e2e_p50_s": percentile([r.e2e for r in ok], 50) if ok else 0.0}
    if cpu_s is not None:
        row["cpu_ms_per_tok"] = 1e3 * cpu_s / tokens if tokens else 0.0
    if client_cpu_s is not None:
        row["client_cpu"] = client_cpu_s / wall  # cores the load generator kept busy
    return row


def serve_run(endpoint: Endpoint, label: str, prompts: list[list[int]], output_len: int,
              concurrency: int, warmups: int, server_pid: int | None) -> dict:
    """A warm-up, then one measured closed-loop run: its row."""
    if warmups:
        # First steps of each batch shape are slow (oneDNN primitives are created per shape,
        # KV-cache pages are touched for the first time).
        asyncio.run(client.run_load(endpoint, (prompts * warmups)[:warmups], output_len,
                                    concurrency, "warm-up"))
    cpu0, server_cpu0 = time.process_time(), tree_cpu_s(server_pid)
    results, wall = asyncio.run(client.run_load(endpoint, prompts, output_len, concurrency,
                                                f"{label} c={concurrency}"))
    server_cpu = None if server_pid is None else tree_cpu_s(server_pid) - server_cpu0
    row = summarize(label, concurrency, results, wall, server_cpu, time.process_time() - cpu0)
    if server_pid is not None:
        row["server_rss_mib"] = tree_rss_mib(server_pid)
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
    return p


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
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

    def warmups(c: int) -> int:
        return len(prompts_for(c)) if args.num_warmups is None else args.num_warmups
    if args.base_url is not None:
        rows, ratios = run_remote(args, prompts_for, warmups), {}
    else:
        rows, ratios = run_local(args, model, prompts_for, warmups)
    print_table(rows, THROUGHPUT_COLUMNS)
    print_table(rows, LATENCY_COLUMNS)
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
                      args.server_pid) for c in args.max_concurrency]


def run_local(args, model: str, prompts_for, warmups) -> tuple[list[dict], dict]:
    """`minivllm serve` started here, then the same prompts on the in-process engine."""
    from minivllm.engine.config import EngineConfig
    config = EngineConfig(model=model, kv_cache_dtype=args.kv_cache_dtype)
    rows, ratios = [], {}
    inproc_engine = InprocEngine(config, max(args.max_concurrency))
    server_args = [*([args.model] if args.model else []), "--kv-cache-dtype",
                   args.kv_cache_dtype, *args.server_args.split()]
    with contextlib.closing(inproc_engine), ServerProcess(server_args) as server:
        endpoint = Endpoint("127.0.0.1", server.port)
        for c in args.max_concurrency:
            prompts = prompts_for(c)
            served = serve_run(endpoint, "serve", prompts, args.random_output_len, c,
                               warmups(c), server.pid)
            run_inproc(inproc_engine, prompts, args.random_output_len, c)  # warm-up
            cpu0 = time.process_time()
            results, wall = run_inproc(inproc_engine, prompts, args.random_output_len, c)
            inproc = summarize("inproc", c, results, wall, time.process_time() - cpu0)
            rows += [served, inproc]
            if inproc["out_tok_per_s"] and served["cpu_ms_per_tok"]:
                ratios[f"serve_vs_inproc_c{c}"] = served["out_tok_per_s"] / inproc["out_tok_per_s"]
                # CPU per token, less sensitive to other programs' load than tok/s
                ratios[f"serve_vs_inproc_cpu_c{c}"] = (inproc["cpu_ms_per_tok"]
                                                       / served["cpu_ms_per_tok"])
    return rows, ratios


if __name__ == "__main__":
    sys.exit(main())
