"""/v1/completions: a prompt (text or token ids, one or a batch) in, text out, whole or streamed.

The stream is the chat stream without the role chunk: `data: {"id": "cmpl-..", "object":
"text_completion", "choices": [{"index": i, "text": "..", "finish_reason": null}]}` events, the
last one of each choice with its finish_reason, a usage chunk with empty choices only when
stream_options.include_usage asks for it, then `data: [DONE]`. With a batch of P prompts and
n choices each, choice index = prompt * n + choice, as in OpenAI's API. In vLLM:
vllm/entrypoints/openai/completion/serving.py.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import AsyncGenerator, AsyncIterator

from msgspec import UNSET

from minivllm.engine.output_processor import RequestOutput
from minivllm.entrypoints.openai.logprobs import check_num_logprobs, completion_logprobs
from minivllm.entrypoints.openai.protocol import (CompletionChoice, CompletionRequest,
                                                  CompletionResponse)
from minivllm.entrypoints.openai.request_checks import UNSUPPORTED_COMPLETION, check_prompt_count
from minivllm.entrypoints.openai.serving_engine import (
    SSE_DONE, OpenAIError, OpenAIServing, UsageCounter, collect_final, openai_finish_reason,
    random_id, sse)
from minivllm.utils import tracing


@dataclass
class Prepared:
    """A request after tokenizing: what every choice of it shares."""

    model: str
    prompts: list[list[int]]
    max_tokens: list[int]
    num_logprobs: int | None
    texts: list[str]  # with echo: each prompt's text


class OpenAIServingCompletion(OpenAIServing):
    unsupported = UNSUPPORTED_COMPLETION

    def prepare(self, request: CompletionRequest) -> Prepared:
        model = self.check_request(request)
        check_prompt_count(len(request.prompts()))
        num_logprobs = check_num_logprobs(request.logprobs, self.vocab_size, "logprobs")
        prompts: list[list[int]] = []
        with tracing.span("tokenize"):
            for p in request.prompts():
                if isinstance(p, str):
                    self.check_text_length(len(p))
                prompts.append(self.encode(p) if isinstance(p, str) else list(p))
        if not prompts:
            raise OpenAIError("the prompt list is empty", param="prompt")
        max_tokens = [self.check_prompt(ids, request.requested_max_tokens(), "prompt",
                                        request.min_tokens) for ids in prompts]
        texts = [p if isinstance(p, str) else self.tokenizer.decode(p, False)
                 for p in request.prompts()] if request.echo else []
        return Prepared(model, prompts, max_tokens, num_logprobs, texts)

    async def create_completion(self, request: CompletionRequest
                                ) -> CompletionResponse | AsyncGenerator[bytes, None]:
        prep = await self.run_sync(self.prepare, request)
        request_id = random_id("cmpl")
        # echo with logprobs: the engine scores the prompt chunk by chunk during its prefill
        results = self.fan_out(prep.prompts, request, prep.max_tokens, request_id,
                               prep.num_logprobs, prep.num_logprobs if request.echo else None)
        counter = UsageCounter(list(map(len, prep.prompts)), request.n)
        if request.stream:
            return self.stream(request, results, request_id, prep, counter)
        return await self.full(request, results, request_id, prep, counter)

    def choice(self, request: CompletionRequest, prep: Prepared, i: int, out: RequestOutput,
               sent_chars: int, sent_tokens: int, finish: str | None) -> CompletionChoice:
        """Choice i's text and logprobs from what was sent so far on: all of it for a whole
        response (sent 0), the new part for a stream; with echo, the prompt comes first (its
        logprobs all arrived during the prefill, before the first sampled token)."""
        prompt, c = i // request.n, out.outputs[0]
        echo = request.echo and sent_chars == 0 and sent_tokens == 0
        text = (prep.texts[prompt] if echo else "") + c.text[sent_chars:]
        logprobs = None
        if prep.num_logprobs is not None:
            ids, lps = c.token_ids[sent_tokens:], c.logprobs[sent_tokens:]
            offset = sent_chars + (len(prep.texts[prompt]) if request.echo and not echo else 0)
            if echo:
                ids, lps = prep.prompts[prompt] + ids, list(out.prompt_logprobs) + lps
            logprobs = completion_logprobs(self.token_namer(request), ids, lps, prep.num_logprobs,
                                           offset)
        return CompletionChoice(i, text, finish, logprobs)

    async def full(self, request: CompletionRequest,
                   results: AsyncIterator[tuple[int, RequestOutput]], request_id: str,
                   prep: Prepared, counter: UsageCounter) -> CompletionResponse:
        final = await collect_final(results)
        choices = [self.choice(request, prep, i, final[i], 0, 0,
                               openai_finish_reason(final[i].outputs[0])) for i in sorted(final)]
        for i, out in final.items():
            counter.update(i, len(out.outputs[0].token_ids))
        return CompletionResponse(request_id, prep.model, int(time.time()), choices,
                                  counter.total())

    async def stream(self, request: CompletionRequest,
                     results: AsyncIterator[tuple[int, RequestOutput]], request_id: str,
                     prep: Prepared, counter: UsageCounter) -> AsyncGenerator[bytes, None]:
        created = int(time.time())
        continuous = request.continuous_usage()
        try:
            sent = [0] * len(counter.completion)  # characters of each choice already sent
            sent_tokens = [0] * len(counter.completion)
            async for i, out in results:
                c = out.outputs[0]
                counter.update(i, len(c.token_ids))
                finish = openai_finish_reason(c) if out.finished else None
                if len(c.text) > sent[i] or finish is not None:
                    choice = self.choice(request, prep, i, out, sent[i], sent_tokens[i], finish)
                    sent[i], sent_tokens[i] = len(c.text), len(c.token_ids)
                    yield sse(CompletionResponse(request_id, prep.model, created, [choice],
                                                 counter.choice(i) if continuous else UNSET))
            if request.include_usage():
                yield sse(CompletionResponse(request_id, prep.model, created, [],
                                             counter.total()))
        except Exception as e:  # the engine died or failed: say so in the stream, then end it
            yield sse(OpenAIError.from_exception(e).error_response())
        finally:
            await results.aclose()  # a client gone between chunks: abort now, not at GC
        yield SSE_DONE
