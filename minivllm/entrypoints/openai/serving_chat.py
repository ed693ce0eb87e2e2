"""/v1/chat/completions: render the chat template, tokenize, generate, answer or stream.

The stream, in the order the openai client parses it (vLLM:
vllm/entrypoints/openai/chat_completion/serving.py (OpenAIServingChat.chat_completion_stream_generator) writes each chunk as
`data: {json}\\n\\n`, an error as a `data: {"error": ...}` event, and always ends with
`data: [DONE]`):

    data: {"id": "chatcmpl-..", "choices": [{"index": 0, "delta": {"role": "assistant",
           "content": ""}, "finish_reason": null}], ...}
    data: {... "choices": [{"index": 0, "delta": {"content": "Paris"}, "finish_reason": null}]}
    data: {... "choices": [{"index": 0, "delta": {"content": "."}, "finish_reason": "stop"}]}
    data: {... "choices": [], "usage": {...}}      only with stream_options.include_usage
    data: [DONE]

One first chunk with the role per choice; `finish_reason` rides on the choice's last content
chunk; every chunk of one response carries the same id and `created`.
"""

from __future__ import annotations

import time
from typing import AsyncGenerator, AsyncIterator

from msgspec import UNSET

from minivllm.engine.output_processor import CompletionOutput, RequestOutput
from minivllm.entrypoints.openai.logprobs import chat_logprobs, check_num_logprobs
from minivllm.entrypoints.openai.protocol import (
    ChatCompletionChoice, ChatCompletionLogProbs, ChatCompletionRequest, ChatCompletionResponse,
    ChatCompletionStreamChoice, ChatCompletionStreamResponse, DeltaMessage, ResponseMessage)
from minivllm.entrypoints.openai.request_checks import UNSUPPORTED_CHAT
from minivllm.entrypoints.openai.serving_engine import (
    SSE_DONE, OpenAIError, OpenAIServing, UsageCounter, collect_final, openai_finish_reason,
    random_id, sse)
from minivllm.utils import tracing


class OpenAIServingChat(OpenAIServing):
    unsupported = UNSUPPORTED_CHAT

    def prepare(self, request: ChatCompletionRequest) -> tuple[str, list[int], int, int | None]:
        model = self.check_request(request)
        num_logprobs = self.check_logprobs(request)
        messages = [{"role": m.role, "content": m.text()} for m in request.messages]
        self.check_text_length(sum(len(m["content"]) for m in messages))
        with tracing.span("tokenize"):
            try:
                prompt = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
            except Exception as e:  # a template that rejects the conversation (jinja2 error)
                raise OpenAIError(f"the chat template rejected the messages: {e}",
                                  param="messages") from e
            token_ids = self.encode(prompt)
        max_tokens = self.check_prompt(token_ids, request.requested_max_tokens(),
                                       min_tokens=request.min_tokens)
        return model, token_ids, max_tokens, num_logprobs

    def check_logprobs(self, request: ChatCompletionRequest) -> int | None:
        """vLLM's rules (ChatCompletionRequest.check_logprobs): top_logprobs needs logprobs."""
        top = request.top_logprobs
        if top is not None and top < 0 and top != -1:
            raise OpenAIError("`top_logprobs` must be a positive value or -1.",
                              param="top_logprobs")
        if top and not request.logprobs:
            raise OpenAIError("when using `top_logprobs`, `logprobs` must be set to true.",
                              param="top_logprobs")
        if not request.logprobs:
            return None
        return check_num_logprobs(top or 0, self.vocab_size, "top_logprobs")

    def logprobs(self, request: ChatCompletionRequest, c: CompletionOutput, sent_tokens: int,
                 num: int | None) -> ChatCompletionLogProbs | None:
        if num is None:
            return None
        return chat_logprobs(self.token_namer(request), c.token_ids[sent_tokens:],
                             c.logprobs[sent_tokens:], num)

    async def create_chat_completion(self, request: ChatCompletionRequest
                                     ) -> ChatCompletionResponse | AsyncGenerator[bytes, None]:
        model, token_ids, max_tokens, num = await self.run_sync(self.prepare, request)
        request_id = random_id("chatcmpl")
        results = self.fan_out([token_ids], request, [max_tokens], request_id, num)
        counter = UsageCounter([len(token_ids)], request.n)
        if request.stream:
            return self.stream(request, results, request_id, model, counter, num)
        return await self.full(request, results, request_id, model, counter, num)

    async def full(self, request: ChatCompletionRequest,
                   results: AsyncIterator[tuple[int, RequestOutput]], request_id: str,
                   model: str, counter: UsageCounter, num: int | None) -> ChatCompletionResponse:
        final = await collect_final(results)
        choices = [ChatCompletionChoice(i, ResponseMessage(final[i].outputs[0].text),
                                        openai_finish_reason(final[i].outputs[0]),
                                        self.logprobs(request, final[i].outputs[0], 0, num))
                   for i in sorted(final)]
        for i, out in final.items():
            counter.update(i, len(out.outputs[0].token_ids))
        return ChatCompletionResponse(request_id, model, choices, counter.total())

    async def stream(self, request: ChatCompletionRequest,
                     results: AsyncIterator[tuple[int, RequestOutput]], request_id: str,
                     model: str, counter: UsageCounter, num: int | None
                     ) -> AsyncGenerator[bytes, None]:
        created = int(time.time())
        continuous = request.continuous_usage()

        def chunk(choices: list[ChatCompletionStreamChoice], usage: object = UNSET) -> bytes:
            return sse(ChatCompletionStreamResponse(request_id, model, created, choices, usage))
        try:
            for i in range(request.n):
                yield chunk([ChatCompletionStreamChoice(i, DeltaMessage("assistant", ""))],
                            counter.choice(i) if continuous else UNSET)
            sent = [0] * request.n  # characters of each choice already sent
            sent_tokens = [0] * request.n
            async for i, out in results:
                c = out.outputs[0]
                counter.update(i, len(c.token_ids))
                finish = openai_finish_reason(c) if out.finished else None
                if len(c.text) > sent[i] or finish is not None:
                    delta = DeltaMessage(content=c.text[sent[i]:])
                    logprobs = self.logprobs(request, c, sent_tokens[i], num)
                    sent[i], sent_tokens[i] = len(c.text), len(c.token_ids)
                    yield chunk([ChatCompletionStreamChoice(i, delta, finish, logprobs)],
                                counter.choice(i) if continuous else UNSET)
            if request.include_usage():
                yield chunk([], counter.total())
        except Exception as e:  # the engine died or failed: say so in the stream, then end it
            yield sse(OpenAIError.from_exception(e).error_response())
        finally:
            await results.aclose()  # a client gone between chunks: abort now, not at GC
        yield SSE_DONE
