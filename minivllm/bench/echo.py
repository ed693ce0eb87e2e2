"""minivllm bench echo: what a long prompt's logprobs (`echo` with `logprobs`) cost the other
streams.

One greedy stream decodes while a long prompt arrives, four ways, in one run: nothing else
(alone); the prompt as a plain request (plain: its prefill runs in chunks of the step budget);
the prompt with prompt logprobs computed chunk by chunk during that prefill (chunked, what
minivllm does, as vLLM does); and the prompt scored in one unchunked pass inside the engine's
loop (one_pass: Worker.prompt_logprobs, the whole-prompt reference). For each: the stream's
inter-token latency (ITL) p50, p99 and max while the long prompt is in the engine, and the peak
resident memory of the engine's processes above the idle engine.

Headline: chunked_minus_plain_p99_ms next to chunk_step_ms (the median ITL of a step that
carries a full prefill chunk, from the plain run). Any long prompt slows the stream by its
prefill chunks (plain vs alone); what the logprobs add on top (chunked vs plain) must stay under
one such step. one_pass shows what scoring the whole prompt at once inside the loop costs.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import threading
import time

from minivllm.bench.common import bench_parser, percentile, print_table, quick_mode, write_json
from minivllm.bench.load import LoadMeter, tree_rss_mib
from minivllm.engine.async_llm import AsyncLLM
from minivllm.engine.config import EngineConfig
from minivllm.sampling_params import SamplingParams
from minivllm.utils.progress import tqdm

MODES = ("alone", "plain", "chunked", "one_pass")
TOP = 5  # top logprobs per prompt position, as a client asking logprobs=5 gets
STREAM_WARMUP = 8  # tokens the stream decodes before the long prompt arrives
STREAM_MAX_TOKENS = 2000  # more than it decodes while any long prompt is in the engine


class PeakRss:
    """The highest resident memory of this process's tree while the block runs, MiB."""

    def __enter__(self) -> "PeakRss":
        self.peak, self._stop = 0.0, threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def _watch(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, tree_rss_mib(os.getpid()))

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


async def long_prompt_load(llm: AsyncLLM, mode: str, prompt: list[int], tag: str) -> None:
    if mode == "one_pass":
        await llm.collective_rpc("prompt_logprobs", (prompt, TOP))
        return
    params = SamplingParams(temperature=0.0, max_tokens=1,
                            prompt_logprobs=TOP if mode == "chunked" else None)
    async for _ in llm.generate(prompt, params, request_id=f"{tag}-load"):
        pass


async def one_round(llm: AsyncLLM, mode: str, prompt: list[int], tag: str) -> dict:
    """The stream's token gaps (ms) while the long prompt is in the engine, and the peak RSS."""
    params = SamplingParams(temperature=0.0, max_tokens=STREAM_MAX_TOKENS, ignore_eos=True)
    arrivals: list[float] = []
    started, window = asyncio.Event(), [0.0, 0.0]

    async def stream() -> None:
        async for out in llm.generate([1 + i for i in range(16)], params, request_id=f"{tag}-s"):
            arrivals.append(time.perf_counter())
            if len(out.outputs[0].token_ids) >= STREAM_WARMUP:
                started.set()

    task = asyncio.create_task(stream())
    await started.wait()
    with PeakRss() as rss:
        window[0] = time.perf_counter()
        if mode == "alone":
            await asyncio.sleep(0.5)
        else:
            await long_prompt_load(llm, mode, prompt, tag)
        window[1] = time.perf_counter()
    while arrivals[-1] < window[1] and not task.done():  # the gap that spans the window's end
        await asyncio.sleep(0.005)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    inside = [b - a for a, b in zip(arrivals, arrivals[1:]) if b > window[0] and a < window[1]]
    return {"gaps_ms": [g * 1e3 for g in inside], "peak_mib": rss.peak,
            "load_s": window[1] - window[0]}


async def run(llm: AsyncLLM, prompt: list[int], rounds: int) -> dict[str, list[dict]]:
    samples: dict[str, list[dict]] = {m: [] for m in MODES}
    bar = tqdm(total=rounds * len(MODES), desc="echo", unit="run")
    try:
        for r in range(rounds):
            for mode in (MODES if r % 2 == 0 else MODES[::-1]):  # alternate who goes first
                samples[mode].append(await one_round(llm, mode, prompt, f"r{r}{mode}"))
                bar.update(1)
    finally:
        bar.close()
    return samples


def summarize(samples: dict[str, list[dict]], idle_mib: float) -> list[dict]:
    rows = []
    for mode, runs in samples.items():
        gaps = [g for run in runs for g in run["gaps_ms"]]
        rows.append({"mode": mode, "itl_p50_ms": statistics.median(gaps),
                     "itl_p99_ms": percentile(gaps, 99), "itl_max_ms": max(gaps),
                     "gaps": len(gaps), "load_s": statistics.median(r["load_s"] for r in runs),
                     "peak_rss_over_idle_mib": max(r["peak_mib"] for r in runs) - idle_mib})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser("echo", __doc__)
    parser.add_argument("--model", help="a .gguf file or HF directory (default SmolLM2-135M)")
    parser.add_argument("--prompt-tokens", type=int, help="the long prompt (default 8000)")
    args = parser.parse_args(argv)
    quick = args.quick or quick_mode()
    n = args.prompt_tokens or (1000 if quick else 8000)
    rounds = 1 if quick else 3
    config = EngineConfig(model=args.model, max_model_len=max(n, STREAM_MAX_TOKENS) + 64)
    llm = AsyncLLM(config)
    try:
        vocab = llm.config.model_config.vocab_size
        prompt = [(37 * i) % (vocab - 3) + 3 for i in range(n)]
        idle_mib = tree_rss_mib(os.getpid())
        with LoadMeter() as load:
            samples = asyncio.run(run(llm, prompt, rounds))
    finally:
        llm.shutdown()
    rows = summarize(samples, idle_mib)
    by = {r["mode"]: r for r in rows}
    print(f"a {n}-token prompt, top {TOP} logprobs, step budget "
          f"{config.max_num_batched_tokens} tokens, {rounds} round(s) of each")
    print_table(rows, ["mode", "itl_p50_ms", "itl_p99_ms", "itl_max_ms", "gaps", "load_s",
                       "peak_rss_over_idle_mib"])
    chunk_step = by["plain"]["itl_p50_ms"]
    moved = by["chunked"]["itl_p99_ms"] - by["plain"]["itl_p99_ms"]
    ratios = {"chunked_minus_plain_p99_ms": round(moved, 1), "chunk_step_ms": round(chunk_step, 1),
              "chunked_vs_plain_p99": round(by["chunked"]["itl_p99_ms"] / by["plain"]["itl_p99_ms"], 3),
              "one_pass_vs_chunked_max": round(by["one_pass"]["itl_max_ms"] / by["chunked"]["itl_max_ms"], 3)}
    print(f"on this machine the prompt's logprobs, computed in chunks, moved the stream's ITL "
          f"p99 by {moved:+.0f} ms over the same prompt without them: "
          f"{'less' if moved < chunk_step else 'MORE'} than one chunk step ({chunk_step:.0f} ms); "
          f"one unchunked pass stalled it up to {by['one_pass']['itl_max_ms']:.0f} ms and took "
          f"{by['one_pass']['peak_rss_over_idle_mib']:.0f} MiB more memory "
          f"(chunked: {by['chunked']['peak_rss_over_idle_mib']:.0f})")
    print(load.describe())
    write_json(args.json, "echo", rows, ratios)
    return 0
