"""`minivllm bench serve`: load-test `minivllm serve` and the in-process engine on the same prompts.

    minivllm bench serve --max-concurrency 1 8 32 --num-prompts 64 --random-input-len 128 \\
        --random-output-len 64 --json serve.json

Like `vllm bench serve` (vllm/benchmarks/serve.py) with its random dataset: random token-id
prompts, a fixed output length (ignore_eos), and a closed loop that keeps `max-concurrency`
streaming requests in flight. Per request it records TTFT (send to first token), the gaps between
tokens (ITL) and the end-to-end time; per run, requests/s and output tokens/s.

The same prompts then run through the engine in this process (EngineCore + OutputProcessor, the
same closed loop, no HTTP, no IPC): the headline `serve_vs_inproc_cN` is the server's output
tok/s over the in-process engine's, measured in the same run. What the ratio misses is what the
server costs: HTTP, JSON, SSE, the engine core's sockets, and the load generator itself, which
shares the CPU; its CPU time is reported as `client_cpu` (fraction of one core).

The load generator is a minimal asyncio HTTP/1.1 client (one connection per request, the chunked
SSE body parsed by hand), several times cheaper per token than httpx or the openai client.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from dataclasses import dataclass, field

import msgspec
import numpy as np

from minivllm.bench.common import bench_parser, percentile, print_table, quick_mode, write_json
from minivllm.entrypoints.openai.server_process import ServerProcess
from minivllm.utils.progress import tqdm

SEED = 0


@dataclass
class RequestResult:
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    e2e: float = 0.0
    output_tokens: int = 0
    error: str | None = None


def random_prompts(num: int, input_len: int, vocab_size: int) -> list[list[int]]:
    """vLLM's random dataset: uniform token ids (special tokens at the low ids are skipped)."""
    rng = np.random.default_rng(SEED)
    low = min(1000, vocab_size // 4)
    return rng.integers(low, vocab_size, size=(num, input_len)).tolist()


async def _read_chunked_events(reader: asyncio.StreamReader):
    """Yield the SSE `data:` payloads of a chunked HTTP body, as bytes."""
    buf = b""
    while True:
        size = int((await reader.readline()).strip() or b"0", 16)
        if size == 0:
            return
        buf += (await reader.readexactly(size + 2))[:-2]
        *events, buf = buf.split(b"\n\n")
        for event in events:
            if event.startswith(b"data: "):
                yield event[6:]


async def stream_completion(host: str, port: int, body: bytes) -> RequestResult:
    """POST one streaming /v1/completions request; time each content event."""
    result = RequestResult()
    start = last = time.perf_counter()
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json"
                     b"\r\nContent-Length: %d\r\n\r\n%s" % (host.encode(), len(body), body))
        status = await reader.readline()
        while (await reader.readline()) not in (b"\r\n", b""):
            pass  # headers
        if b" 200 " not in status:
            result.error = status.decode().strip()
            return result
        decode = msgspec.json.decode
        async for data in _read_chunked_events(reader):
            if data == b"[DONE]":
                break
            event = decode(data)
            if "error" in event:
                result.error = event["error"]["message"]
                break
            now = time.perf_counter()
            if event["choices"] and event["choices"][0]["text"]:
                if result.ttft == 0.0:
                    result.ttft = now - start
                else:
                    result.itl.append(now - last)
                last = now
            if event.get("usage"):
                result.output_tokens = event["usage"]["completion_tokens"]
        result.e2e = time.perf_counter() - start
    finally:
        writer.close()
    return result


async def run_load(host: str, port: int, prompts: list[list[int]], output_len: int,
                   concurrency: int, desc: str) -> tuple[list[RequestResult], float]:
    """Closed loop: `concurrency` requests in flight until every prompt is served."""
    semaphore = asyncio.Semaphore(concurrency)
    bar = tqdm(total=len(prompts), desc=desc, unit="req", leave=False)

    async def one(prompt: list[int]) -> RequestResult:
        body = msgspec.json.encode({
            "prompt": prompt, "max_tokens": output_len, "temperature": 0.0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}})
        async with semaphore:
            result = await stream_completion(host, port, body)
        bar.update(1)
        return result
    start = time.perf_counter()
    results = await asyncio.gather(*(one(p) for p in prompts))
    wall = time.perf_counter() - start
    bar.close()
    return list(results), wall


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


def summarize(kind: str, concurrency: int, results: list[RequestResult], wall: float,
              cpu_s: float, client_cpu_s: float | None = None) -> dict:
    """One row. cpu_s: CPU seconds the engine's processes used (the server's whole process tree,
    or this process for the in-process engine); client_cpu_s: the load generator's."""
    ok = [r for r in results if r.error is None]
    itl = [x for r in ok for x in r.itl]
    tokens = sum(r.output_tokens for r in ok)
    row = {"engine": kind, "concurrency": concurrency, "requests": len(ok),
           "errors": len(results) - len(ok), "req_per_s": len(ok) / wall,
           "out_tok_per_s": tokens / wall,
           "ttft_p50_ms": 1e3 * percentile([r.ttft for r in ok], 50) if ok else 0.0,
           "ttft_p99_ms": 1e3 * percentile([r.ttft for r in ok], 99) if ok else 0.0,
           "itl_p50_ms": 1e3 * percentile(itl, 50) if itl else 0.0,
           "itl_p99_ms": 1e3 * percentile(itl, 99) if itl else 0.0,
           "e2e_p50_s": percentile([r.e2e for r in ok], 50) if ok else 0.0,
           "cpu_ms_per_tok": 1e3 * cpu_s / tokens if tokens else 0.0}
    if client_cpu_s is not None:
        row["client_cpu"] = client_cpu_s / wall  # cores the load generator kept busy
    return row


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) used so far by a process and its live descendants."""
    import psutil
    root = psutil.Process(pid)
    total = 0.0
    for p in [root, *root.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def main(argv: list[str] | None = None) -> int:
    p = bench_parser("serve", __doc__)
    p.add_argument("--model", default=None, help="default: the bundled SmolLM2-135M-Instruct")
    p.add_argument("--max-concurrency", type=int, nargs="+", default=[32])
    p.add_argument("--num-prompts", type=int, default=None, help="default: 2 x max concurrency")
    p.add_argument("--random-input-len", type=int, default=128)
    p.add_argument("--random-output-len", type=int, default=64)
    p.add_argument("--server-args", default="", help="extra `minivllm serve` flags, quoted")
    args = p.parse_args(argv)
    if args.quick or quick_mode():
        args.random_input_len, args.random_output_len = 32, 16

    from minivllm.engine.config import EngineConfig
    config = EngineConfig(model=args.model)
    load = os.getloadavg()[0]
    print(f"minivllm bench serve: model {config.model}; load average {load:.2f} on "
          f"{os.cpu_count()} cores (numbers are not to be trusted above ~1)")
    rows, ratios = [], {}
    inproc_engine = InprocEngine(config, max(args.max_concurrency))
    server_args = [*([args.model] if args.model else []), *args.server_args.split()]
    with contextlib.closing(inproc_engine), ServerProcess(server_args) as server:
        port = server.port
        for c in args.max_concurrency:
            n = args.num_prompts or 2 * c
            prompts = random_prompts(n, args.random_input_len, config.model_config.vocab_size)
            # Warm-up runs of the same load: first steps of each batch shape are slow (oneDNN
            # primitives are created per shape, KV-cache pages are touched for the first time).
            asyncio.run(run_load("127.0.0.1", port, prompts,
                                 args.random_output_len, c, "warm-up"))
            cpu0, server_cpu0 = time.process_time(), tree_cpu_s(server.pid)
            results, wall = asyncio.run(run_load("127.0.0.1", port, prompts,
                                                 args.random_output_len, c, f"serve c={c}"))
            served = summarize("serve", c, results, wall, tree_cpu_s(server.pid) - server_cpu0,
                               time.process_time() - cpu0)
            for error in sorted({r.error for r in results if r.error})[:3]:
                print(f"c={c}: a request failed: {error}", file=sys.stderr)
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
    print_table(rows, ["engine", "concurrency", "requests", "errors", "req_per_s",
                       "out_tok_per_s", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms",
                       "itl_p99_ms", "e2e_p50_s", "cpu_ms_per_tok", "client_cpu"])
    for name, value in ratios.items():
        print(f"{name} = {value:.3f}")
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    write_json(args.json, "serve", rows, ratios)
    return 0


if __name__ == "__main__":
    sys.exit(main())
