"""What both OpenAI endpoints share: validation, sampling parameters, errors, and the fan-out of
`n` choices into `n` engine requests.

Errors follow vLLM: a client's mistake is 400 BadRequestError with OpenAI's body
`{"error": {"message", "type", "param", "code"}}`, an unknown model 404 NotFoundError, a dead
engine 500 InternalServerError (and /health 503). In vLLM: create_error_response,
vllm/entrypoints/serve/exception_handling/error_response.py (create_error_response); the context-length check,
vllm/renderers/params.py (TokenizeParams._token_len_check); max_tokens clamped to the room left,
vllm/entrypoints/serve/utils/api_utils.py (get_max_tokens).

Tokenizing runs on a worker thread, never on the event loop: one huge prompt must not stall
every stream and /health. A text longer than the context could hold even at the longest token
is refused before tokenizing (vLLM: _text_len_check, vllm/renderers/params.py (TokenizeParams._text_len_check)).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from http import HTTPStatus
from typing import Any, AsyncGenerator, AsyncIterator, Callable, TypeVar

import numpy as np
import pydantic

from minivllm.engine.output_processor import CompletionOutput, RequestOutput
from minivllm.entrypoints.openai.errors import OpenAIError
from minivllm.entrypoints.openai.metrics import ServerMetrics
from minivllm.entrypoints.openai.protocol import SamplingFields, UsageInfo, to_json
from minivllm.entrypoints.openai.request_checks import (check_min_tokens, check_unsupported,
                                                        logit_bias_ids, openai_wording)
from minivllm.sampling_params import SEED_MAX, SamplingParams
from minivllm.utils import tracing


def validation_error(exc: pydantic.ValidationError) -> OpenAIError:
    """A body that is not JSON, or a field of the wrong type or range: 400, naming the field."""
    errors = exc.errors(include_url=False)
    first = errors[0] if errors else {}
    param = ".".join(str(p) for p in first.get("loc", ())) or None
    if first.get("type") == "json_invalid":
        return OpenAIError(f"the body is not valid JSON: {first.get('msg')}", param=None)
    if len(errors) == 1 and (message := openai_wording(first)):  # OpenAI's own words
        return OpenAIError(message, param=param)
    parts = [openai_wording(e) or f"{'.'.join(map(str, e.get('loc', ()))) or 'body'}: "
             f"{e.get('msg')}" for e in errors[:3]]
    return OpenAIError(f"{len(errors)} validation error{'s' * (len(errors) != 1)}: "
                       + "; ".join(parts), param=param)


def random_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def sse(body: Any) -> bytes:
    """One server-sent event."""
    with tracing.span("sse_write"):
        return b"data: " + to_json(body) + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


def openai_finish_reason(completion: CompletionOutput) -> str:
    """"stop" or "length". The engine's "error" (a request it refused or failed) becomes an
    error with its reason; "abort" only reaches a consumer that left, so nobody reads it."""
    if completion.finish_reason == "error":
        raise OpenAIError(f"the engine failed this request: {completion.stop_reason}",
                          HTTPStatus.INTERNAL_SERVER_ERROR, "InternalServerError")
    return completion.finish_reason


def usage(prompt_tokens: int, completion_tokens: int) -> UsageInfo:
    return UsageInfo(prompt_tokens, completion_tokens, prompt_tokens + completion_tokens)


class UsageCounter:
    """Usage as OpenAI and vLLM count it: each prompt's tokens once, however many choices it
    has (n), and every choice's completion tokens (vLLM: OpenAIServingCompletion's
    completion_stream_generator and request_output_to_completion_response, OpenAIServingChat's
    chat_completion_stream_generator_raw). Choice i belongs to prompt i // n."""

    def __init__(self, prompt_lens: list[int], n: int) -> None:
        self.prompt_lens, self.n = prompt_lens, n
        self.completion = [0] * (len(prompt_lens) * n)

    def update(self, choice: int, num_tokens: int) -> None:
        self.completion[choice] = num_tokens

    def choice(self, i: int) -> UsageInfo:
        """One choice's usage so far: stream_options.continuous_usage_stats puts it on each
        of its chunks."""
        return usage(self.prompt_lens[i // self.n], self.completion[i])

    def total(self) -> UsageInfo:
        return usage(sum(self.prompt_lens), sum(self.completion))


T = TypeVar("T")
GIL_FREE_CHARS = 4096  # texts this long are tokenized with the GIL released


class OpenAIServing:
    unsupported: dict[str, tuple] = {}  # fields refused unless they change nothing
    app_state: Any = None  # the app's state: once `stopping`, no request starts

    def __init__(self, engine: Any, served_model_names: list[str], metrics: ServerMetrics,
                 executor: ThreadPoolExecutor) -> None:
        self.engine = engine  # AsyncLLM
        self.executor = executor  # where requests are parsed and tokenized, off the event loop
        self.tokenizer = engine.tokenizer
        self.max_model_len: int = engine.config.max_model_len
        self.vocab_size: int = engine.config.model_config.vocab_size
        self.served_model_names = served_model_names
        self.metrics = metrics

    def check_request(self, request: SamplingFields) -> str:
        """The model name to echo back; 404 for a name this server does not serve; 400 for
        fields that contradict each other or the model."""
        check_unsupported(request.model_extra, self.unsupported)
        if request.stream_options is not None and not request.stream:  # vLLM's same 400
            raise OpenAIError("Stream options can only be defined when `stream=True`.",
                              param="stream_options")
        if any(not s for s in request.stop_list()):  # vLLM's _verify_args
            raise OpenAIError("stop cannot contain an empty string.", param="stop")
        logit_bias_ids(request.logit_bias, self.vocab_size)  # its 400 before any work
        bad = [t for t in request.stop_token_ids or () if not 0 <= t < self.vocab_size]
        if bad:
            raise OpenAIError(f"stop_token_ids must be token ids in [0, {self.vocab_size}) "
                              f"(this model's vocabulary); got {bad[:5]}",
                              param="stop_token_ids")
        if request.model is None or request.model in self.served_model_names:
            return self.served_model_names[0]
        raise OpenAIError(f"The model `{request.model}` does not exist; this server serves "
                          f"{self.served_model_names}", HTTPStatus.NOT_FOUND, "NotFoundError",
                          "model")

    def token_namer(self, request: SamplingFields) -> Any:
        """What names a token in logprobs: the tokenizer, or None for "token_id:<id>"."""
        return None if request.return_tokens_as_token_ids else self.tokenizer

    async def run_sync(self, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args) on the tokenizing thread; the event loop serves everyone meanwhile."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    def encode(self, text: str) -> list[int]:
        """The text's token ids. tokenizers' encode holds the GIL for its whole run (0.4 s for
        a 660 KB prompt, during which the event loop waits); encode_batch releases it."""
        if len(text) < GIL_FREE_CHARS:
            return self.tokenizer.encode(text)
        backend = self.tokenizer.backend
        return backend.encode_batch([text], add_special_tokens=False)[0].ids

    def check_text_length(self, num_chars: int) -> None:
        """400 for a text too long for the context whatever its tokens: no tokenizing needed."""
        max_chars = self.max_model_len * self.tokenizer.max_chars_per_token
        if num_chars > max_chars:
            raise OpenAIError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"your prompt contains {num_chars} characters (more than {max_chars} "
                f"characters, which is the upper bound for {self.max_model_len} input tokens). "
                f"Please reduce the length of the input prompt.", param="input_text")

    def check_prompt(self, token_ids: list[int], max_tokens: int | None,
                     what: str = "messages", min_tokens: int = 0) -> int:
        """400 for a prompt the context cannot hold or a max_tokens above the context; returns
        max_tokens clamped to the room the prompt leaves, as vLLM's get_max_tokens does."""
        n = len(token_ids)
        if n == 0:
            raise OpenAIError("the prompt is empty", param="prompt")
        if n >= self.max_model_len:
            raise OpenAIError(f"This model's maximum context length is {self.max_model_len} "
                              f"tokens. However, your prompt contains {n} input tokens, which "
                              f"leaves no room for output. Please reduce the length of the "
                              f"input {what}.", param="input_tokens")
        if max_tokens is not None and max_tokens > self.max_model_len:
            raise OpenAIError(f"max_tokens is {max_tokens}, more than this model's context of "
                              f"{self.max_model_len} tokens", param="max_tokens")
        if min(token_ids) < 0 or max(token_ids) >= self.vocab_size:
            raise OpenAIError(f"token ids must be in [0, {self.vocab_size})", param="prompt")
        room = self.max_model_len - n
        max_tokens = room if max_tokens is None else min(max_tokens, room)
        check_min_tokens(min_tokens, max_tokens)
        return max_tokens

    def sampling_params(self, request: SamplingFields, max_tokens: int, choice: int,
                        logprobs: int | None = None, prompt_logprobs: int | None = None
                        ) -> SamplingParams:
        """Choice i of n gets seed + i, so seeded choices are repeatable and still differ. A
        top_k at or past the vocabulary is clamped by the engine core (normalize_sampling_params)."""
        seed = request.seed
        if seed is not None and seed != -1 and choice:  # -1: vLLM's "no seed"
            seed = seed + choice if seed + choice <= SEED_MAX else seed - choice
        return SamplingParams(
            temperature=1.0 if request.temperature is None else request.temperature,
            top_p=1.0 if request.top_p is None else request.top_p,
            top_k=request.top_k or 0, seed=seed, max_tokens=max_tokens,
            stop=request.stop_list(), stop_token_ids=request.stop_token_ids or [],
            ignore_eos=request.ignore_eos, logprobs=logprobs, prompt_logprobs=prompt_logprobs,
            **self.penalties(request))

    def penalties(self, request: SamplingFields) -> dict[str, Any]:
        """The penalties, logit_bias and min_tokens (a default travels as nothing: the Struct
        omits defaults on the wire)."""
        return {"presence_penalty": request.presence_penalty or 0.0,
                "frequency_penalty": request.frequency_penalty or 0.0,
                "repetition_penalty": request.repetition_penalty or 1.0,
                "logit_bias": logit_bias_ids(request.logit_bias, self.vocab_size) or None,
                "min_tokens": request.min_tokens}

    async def generate(self, token_ids: list[int], params: SamplingParams,
                       request_id: str) -> AsyncGenerator[RequestOutput, None]:
        """AsyncLLM.generate, timed and counted for /metrics: TTFT, ITL, e2e, tokens as they
        come, and how the request ended (a consumer that leaves early: "abort")."""
        if self.app_state is not None and self.app_state.stopping:
            from minivllm.entrypoints.openai.http_server import stop_error
            raise stop_error()
        start = last = time.perf_counter()
        prompt = np.asarray(token_ids, dtype=np.int32)
        num_prev, reason = 0, "abort"
        try:
            async for out in self.engine.generate(prompt, params, request_id):
                now = time.perf_counter()
                num = len(out.outputs[0].token_ids)
                if num > num_prev:
                    self.metrics.observe_tokens(0 if num_prev else len(token_ids), now - last,
                                                now - start, num - num_prev)
                    num_prev, last = num, now
                if out.finished:
                    reason = out.outputs[0].finish_reason or "abort"
                    if reason in ("stop", "length"):
                        self.metrics.observe_finished(now - start)
                yield out
        except Exception:
            reason = "error"  # the engine refused or failed it, or died
            raise
        finally:
            self.metrics.observe_ended(reason)

    def fan_out(self, prompts: list[list[int]], request: SamplingFields, max_tokens: list[int],
                request_id: str, logprobs: int | None = None, prompt_logprobs: int | None = None
                ) -> AsyncIterator[tuple[int, RequestOutput]]:
        """One engine request per (prompt, choice): choice index = prompt * n + choice."""
        gens = [self.generate(ids, self.sampling_params(request, mt, j, logprobs, prompt_logprobs),
                              f"{request_id}-{i}-{j}")
                for i, (ids, mt) in enumerate(zip(prompts, max_tokens))
                for j in range(request.n)]
        return merge_async_iterators(gens)


async def collect_final(results: AsyncIterator[tuple[int, RequestOutput]]
                        ) -> dict[int, RequestOutput]:
    """The last (finished) output of each choice, for a whole (non-streamed) response."""
    final: dict[int, RequestOutput] = {}
    try:
        async for i, out in results:
            if out.finished:
                final[i] = out
    finally:
        await results.aclose()  # cancelled (the client left): abort what still runs
    return final


async def merge_async_iterators(gens: list[AsyncGenerator[Any, None]]
                                ) -> AsyncGenerator[tuple[int, Any], None]:
    """Items of several async generators as they come, tagged with the generator's index.
    Leaving early (or being cancelled) closes every generator, which aborts its request."""
    if len(gens) == 1:  # the usual n=1: no tasks, no queue
        try:
            async for item in gens[0]:
                yield 0, item
        finally:
            await gens[0].aclose()
        return
    pending = {asyncio.ensure_future(g.__anext__()): i for i, g in enumerate(gens)}
    try:
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                i = pending.pop(task)
                try:
                    item = task.result()
                except StopAsyncIteration:
                    continue
                pending[asyncio.ensure_future(gens[i].__anext__())] = i
                yield i, item
    finally:
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for g in gens:
            await g.aclose()
