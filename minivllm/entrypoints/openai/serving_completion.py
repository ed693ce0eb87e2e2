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
from typing import AsyncGenerator, AsyncIterator

from msgspec import UNSET

from minivllm.engine.output_processor import RequestOutput
from minivllm.entrypoints.openai.protocol import (CompletionChoice, CompletionRequest,
                                                  CompletionResponse)
from minivllm.entrypoints.openai.serving_engine import (
    SSE_DONE, OpenAIError, OpenAIServing, UsageCounter, collect_final, openai_finish_reason, random_id,
    sse)
from minivllm.utils import tracing


class OpenAIServingCompletion(OpenAIServing):
    def prepare(self, request: CompletionRequest) -> tuple[str, list[list[int]], list[int]]:
        model = self.check_request(request)
        prompts: list[list[int]] = []
        with tracing.span("tokenize"):
            for p in request.prompts():
                if isinstance(p, str):
                    self.check_text_length(len(p))
                prompts.append(self.tokenizer.encode(p) if isinstance(p, str) else list(p))
        if not prompts:
            raise OpenAIError("the prompt list is empty", param="prompt")
        max_tokens = [self.check_prompt(ids, request.requested_max_tokens(), "prompt")
                      for ids in prompts]
        return model, prompts, max_tokens

    async def create_completion(self, request: CompletionRequest
                                ) -> CompletionResponse | AsyncGenerator[bytes, None]:
        model, prompts, max_tokens = await self.run_sync(self.prepare, request)
        request_id = random_id("cmpl")
        results = self.fan_out(prompts, request, max_tokens, request_id)
        counter = UsageCounter(list(map(len, prompts)), request.n)
        if request.stream:
            return self.stream(request, results, request_id, model, counter)
        return await self.full(results, request_id, model, counter)

    async def full(self, results: AsyncIterator[tuple[int, RequestOutput]], request_id: str,
                   model: str, counter: UsageCounter) -> CompletionResponse:
        final = await collect_final(results)
        choices = [CompletionChoice(i, final[i].outputs[0].text,
                                    openai_finish_reason(final[i].outputs[0]))
                   for i in sorted(final)]
        for i, out in final.items():
            counter.update(i, len(out.outputs[0].token_ids))
        return CompletionResponse(request_id, model, int(time.time()), choices,
                                  counter.total())

    async def stream(self, request: CompletionRequest,
                     results: AsyncIterator[tuple[int, RequestOutput]], request_id: str,
                     model: str, counter: UsageCounter) -> AsyncGenerator[bytes, None]:
        created = int(time.time())
        continuous = request.continuous_usage()
        try:
            sent = [0] * len(counter.completion)
            async for i, out in results:
                c = out.outputs[0]
                counter.update(i, len(c.token_ids))
                finish = openai_finish_reason(c) if out.finished else None
                if len(c.text) > sent[i] or finish is not None:
                    choice = CompletionChoice(i, c.text[sent[i]:], finish)
                    sent[i] = len(c.text)
                    yield sse(CompletionResponse(request_id, model, created, [choice],
                                                 counter.choice(i) if continuous else UNSET))
            if request.include_usage():
                yield sse(CompletionResponse(request_id, model, created, [], counter.total()))
        except Exception as e:  # the engine died or failed: say so in the stream, then end it
            yield sse(OpenAIError.from_exception(e).error_response())
        finally:
            await results.aclose()  # a client gone between chunks: abort now, not at GC
        yield SSE_DONE
