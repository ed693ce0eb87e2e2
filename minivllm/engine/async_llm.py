"""AsyncLLM: the asyncio front end the HTTP server uses, one async generator per request.

    llm = AsyncLLM(EngineConfig())                   # starts its engine core process(es)
    async for out in llm.generate("Hi", SamplingParams(max_tokens=8), request_id="r1"):
        print(out.outputs[0].text)                   # cumulative text; the last is finished
    llm.shutdown()

One output-handler task reads EngineCoreOutputs (AsyncMPClient), detokenizes them
(OutputProcessor) and hands each request's RequestOutput to that request's collector. Outputs
are cumulative, so a consumer slower than the engine just sees a later state, and nothing
queues up behind it. A consumer that stops iterating (or whose task is cancelled) aborts its
request in the engine. Several API server processes can share the engines: each is a client
with its own addresses and client_index (engine/launcher.py: launch_core_engines).
In vLLM: AsyncLLM in vllm/v1/engine/async_llm.py (its generate, and _run_output_handler, the
output handler); RequestOutputCollector in vllm/v1/engine/output_processor.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import weakref
from typing import Any, AsyncGenerator

from minivllm.engine.config import EngineConfig
from minivllm.engine.core_client import EngineCoreClient
from minivllm.engine.core_client_mp import call_in_loop
from minivllm.engine.exceptions import EngineDeadError
from minivllm.engine.input_processor import PromptType, process_inputs
from minivllm.engine.output_processor import OutputProcessor, RequestOutput
from minivllm.engine.messages import ClientAddresses
from minivllm.sampling_params import SamplingParams
from minivllm.tokenizer import Tokenizer
from minivllm.utils import tracing

STATS_SUMMED = ("num_running", "num_waiting", "kv_blocks_used", "kv_blocks_total",
                "num_preemptions")


class RequestOutputCollector:
    """The latest RequestOutput of one request (or the error that ends it), and a wake-up."""

    def __init__(self) -> None:
        self.output: RequestOutput | BaseException | None = None
        self.ready = asyncio.Event()

    def put(self, output: RequestOutput | BaseException) -> None:
        if not isinstance(self.output, BaseException):  # an error is final
            self.output = output
        self.ready.set()

    async def get(self) -> RequestOutput:
        await self.ready.wait()
        self.ready.clear()
        output, self.output = self.output, None
        if isinstance(output, BaseException):
            self.output = output  # stays for any later get
            raise output
        return output


class AsyncLLM:
    def __init__(self, config: EngineConfig, client_addresses: ClientAddresses | None = None,
                 client_index: int = 0) -> None:
        self.config = config
        self.tokenizer = Tokenizer.from_path(config.model)
        self.output_processor = OutputProcessor(self.tokenizer)
        self.collectors: dict[str, RequestOutputCollector] = {}
        self._handler: dict[str, asyncio.Task] = {}  # "task": the output handler, once started
        self._dead_error: EngineDeadError | None = None
        self.engine_core = EngineCoreClient.make_client(
            config, asyncio_mode=True, multiprocess=True, client_addresses=client_addresses,
            client_index=client_index)
        # A dropped AsyncLLM stops its engine: the handler task holds it only weakly
        # (vLLM's output handler captures what it needs for the same reason, AsyncLLM._run_output_handler).
        self._finalizer = weakref.finalize(self, _stop, self.engine_core, self._handler)

    @property
    def output_handler(self) -> asyncio.Task | None:
        return self._handler.get("task")

    @property
    def dead_error(self) -> EngineDeadError | None:
        return self._dead_error or self.engine_core.dead_error

    @property
    def errored(self) -> bool:
        return self.dead_error is not None

    def _ensure_output_handler(self) -> None:
        if "task" not in self._handler:
            self._handler["task"] = asyncio.get_running_loop().create_task(_run_output_handler(
                weakref.ref(self), self.engine_core, self.output_processor, self.collectors))

    async def generate(self, prompt: PromptType,
                       sampling_params: SamplingParams, request_id: str
                       ) -> AsyncGenerator[RequestOutput, None]:
        """Yield the request's cumulative RequestOutput after each step it progressed in.
        ValueError before the first yield for a request the engine cannot run."""
        if self.dead_error is not None:
            raise self.dead_error
        if request_id in self.collectors:
            raise ValueError(f"request id {request_id!r} is already running; use a unique id")
        request, text = process_inputs(self.config, self.tokenizer, request_id, prompt,
                                       sampling_params)
        self._ensure_output_handler()
        collector = self.collectors[request_id] = RequestOutputCollector()
        self.output_processor.add_request(request_id, text, request.prompt_token_ids.tolist(),
                                          sampling_params)
        finished = False
        try:
            await self.engine_core.add_request_async(request)
            while not finished:
                out = await collector.get()
                finished = out.finished
                yield _snapshot(out)
        finally:
            del self.collectors[request_id]
            if not finished:  # the consumer left, was cancelled, or the engine died
                self.output_processor.abort_requests([request_id])
                if self.dead_error is None:
                    await self.engine_core.abort_requests_async([request_id])

    async def abort(self, request_id: str) -> None:
        """End a request: its blocks are freed, and its generator ends with "abort"."""
        state = self.output_processor.request_states.get(request_id)
        self.output_processor.abort_requests([request_id])
        collector = self.collectors.get(request_id)
        if collector is not None and state is not None:
            state.output.outputs[0].finish_reason, state.output.finished = "abort", True
            collector.put(state.output)
        await self.engine_core.abort_requests_async([request_id])

    async def get_stats(self) -> dict[str, Any]:
        """num_running, num_waiting, kv_blocks_used, kv_blocks_total, summed over DP engines."""
        per_engine = await self.engine_core.call_utility_all_async("get_stats")
        return {k: sum(s[k] for s in per_engine) for k in STATS_SUMMED}

    async def reset_prefix_cache(self) -> None:
        await self.engine_core.call_utility_all_async("reset_prefix_cache")

    async def collective_rpc(self, method: str, args: tuple = (), kwargs: dict | None = None,
                             timeout: float | None = None) -> list:
        return await self.engine_core.call_utility_async("collective_rpc", method, list(args),
                                                         kwargs, timeout)

    def shutdown(self) -> None:
        """Stop the engine core processes; nothing is left behind. Idempotent."""
        self._finalizer()
        for collector in self.collectors.values():
            collector.put(self.engine_core.dead_error)


async def _run_output_handler(llm_ref: "weakref.ref[AsyncLLM]", engine_core: Any,
                              output_processor: OutputProcessor,
                              collectors: dict[str, RequestOutputCollector]) -> None:
    """AsyncLLM's output handler: detokenize each step's outputs and hand them to the
    requests' collectors. It holds the AsyncLLM only weakly, to record a death."""
    try:
        while True:
            outputs = await engine_core.get_output_async()
            with tracing.span("detokenize"):
                updated, to_abort = output_processor.process_outputs(outputs)
            for out in updated:
                collector = collectors.get(out.request_id)
                if collector is not None:
                    collector.put(out)
            if to_abort:  # stop strings, found here after detokenizing
                await engine_core.abort_requests_async(to_abort)
    except asyncio.CancelledError:
        raise
    except Exception as e:  # noqa: BLE001 - a dead handler must not leave streams waiting
        error = e if isinstance(e, EngineDeadError) else EngineDeadError(
            f"the output handler failed: {e!r}; restart the engine")
        if (llm := llm_ref()) is not None:
            llm._dead_error = error
        for collector in collectors.values():
            collector.put(error)


def _stop(engine_core: Any, handler: dict[str, asyncio.Task]) -> None:
    """shutdown(), or the finalizer of a dropped AsyncLLM: cancel the handler, stop the engine."""
    task = handler.get("task")
    if task is not None and not task.done():
        call_in_loop(task.get_loop(), task.cancel)
    engine_core.shutdown()


def _snapshot(out: RequestOutput) -> RequestOutput:
    """A copy the consumer may keep: the processor goes on appending to the original."""
    return dataclasses.replace(out, outputs=[dataclasses.replace(
        c, token_ids=list(c.token_ids), logprobs=None if c.logprobs is None else list(c.logprobs))
        for c in out.outputs])
