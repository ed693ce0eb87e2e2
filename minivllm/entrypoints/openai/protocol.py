"""The OpenAI API's request and response bodies, the subset minivllm serves.

Requests are pydantic models, because FastAPI validates a body against them and reports every
bad field (the server answers those with 400, as vLLM does, not FastAPI's 422). Responses are
msgspec Structs: the server writes one JSON chunk per token per stream, and msgspec encodes a
chunk several times faster than pydantic's model_dump_json. A field left `UNSET` is not written,
as vLLM's `exclude_unset` leaves it out; `finish_reason` stays in every choice (null until the
end) because the openai client reads it from every chunk.

In vLLM: ChatCompletionRequest, vllm/entrypoints/openai/chat_completion/protocol.py;
CompletionRequest, vllm/entrypoints/openai/completion/protocol.py; ErrorInfo and ErrorResponse,
vllm/entrypoints/serve/engine/protocol.py (ErrorInfo).
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal, Union

import msgspec
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

MAX_N = 16  # choices per request: each is a request in the engine, so cap the fan-out


class OpenAIBaseModel(BaseModel):
    model_config = ConfigDict(extra="allow")  # unknown OpenAI fields are ignored, not errors


class StreamOptions(OpenAIBaseModel):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's extension: usage on every chunk too


class TextContent(OpenAIBaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(OpenAIBaseModel):
    role: str
    content: Union[str, list[TextContent], None] = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


INT64_MIN, INT64_MAX = -2**63, 2**63 - 1
Bias = Annotated[float, Field(allow_inf_nan=False)]


class SamplingFields(OpenAIBaseModel):
    """The fields both endpoints share. The ranges are vLLM's (SamplingParams._verify_args in
    vllm/sampling_params.py); a NaN or infinity is refused as not finite. top_k has no upper
    bound but int64: one at or above the vocabulary keeps every token, as vLLM clamps it
    (InputBatch.add_request, vllm/v1/worker/gpu_input_batch.py)."""

    model: str | None = None
    user: str | None = None  # OpenAI's end-user id: accepted, not used
    n: int = Field(1, ge=1, le=MAX_N)
    temperature: float | None = Field(None, ge=0.0, le=2.0, allow_inf_nan=False)
    top_p: float | None = Field(None, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: int | None = Field(None, ge=-1, le=INT64_MAX)  # vLLM's extension
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0, allow_inf_nan=False)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0, allow_inf_nan=False)
    repetition_penalty: float | None = Field(None, gt=0.0, allow_inf_nan=False)  # vLLM's
    logit_bias: dict[str, Bias] | None = None  # token id (as text) -> bias, clamped to ±100
    min_tokens: int = Field(0, ge=0, le=INT64_MAX)  # vLLM's extension
    seed: int | None = Field(None, ge=INT64_MIN, le=INT64_MAX)
    stop: Union[str, list[str], None] = None
    stop_token_ids: list[int] | None = None  # vLLM's extension
    ignore_eos: bool = False  # vLLM's extension: the benchmark's fixed output lengths
    stream: bool = False
    stream_options: StreamOptions | None = None
    return_tokens_as_token_ids: bool = False  # vLLM's extension: logprobs' tokens as ids

    def stop_list(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def continuous_usage(self) -> bool:
        """Usage on every chunk: only with include_usage, as vLLM's should_include_usage."""
        return self.include_usage() and self.stream_options.continuous_usage_stats


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1, le=INT64_MAX)  # deprecated, still honoured
    max_completion_tokens: int | None = Field(None, ge=1, le=INT64_MAX)
    logprobs: bool = False
    top_logprobs: int | None = None

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


PROMPT_SHAPES = (("a string", str), ("a list of token ids", list[int]),
                 ("a list of strings", list[str]), ("a list of lists of token ids",
                                                    list[list[int]]))


def check_prompt_shape(prompt: Any) -> Any:
    """The prompt as one of OpenAI's four shapes, checked by msgspec in C: pydantic's union of
    the four took 12 s (on a loaded machine) to validate 5 million token ids, holding the GIL
    and so stalling the event loop; this takes a twentieth of that."""
    if isinstance(prompt, list):
        if not prompt:
            return prompt  # prepare() says the list is empty
        first = prompt[0]
        name, shape = PROMPT_SHAPES[1 if isinstance(first, (int, float)) else
                                    2 if isinstance(first, str) else 3]
    else:
        name, shape = PROMPT_SHAPES[0]
    try:
        return msgspec.convert(prompt, shape)
    except msgspec.ValidationError as e:
        raise ValueError(f"must be a string, a list of strings, a list of token ids or a list "
                         f"of lists of token ids; as {name}: {e}") from None


class CompletionRequest(SamplingFields):
    prompt: Annotated[Any, AfterValidator(check_prompt_shape)]
    max_tokens: int | None = Field(16, ge=1, le=INT64_MAX)  # OpenAI's default
    logprobs: int | None = None  # the sampled token's logprob and this many top ones
    echo: bool = False  # the prompt's text before the completion's

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    def prompts(self) -> list[str | list[int]]:
        """One prompt or a batch: a string, a token list, or a list of either."""
        p = self.prompt
        if isinstance(p, str) or (p and isinstance(p[0], int)):
            return [p]
        return list(p)


# ---- responses (msgspec) ----

class ErrorInfo(msgspec.Struct):
    message: str
    type: str
    param: str | None
    code: int


class ErrorResponse(msgspec.Struct):
    error: ErrorInfo


class UsageInfo(msgspec.Struct):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class ModelCard(msgspec.Struct):
    id: str
    created: int
    max_model_len: int
    object: str = "model"
    owned_by: str = "minivllm"
    root: str | None = None


class ModelList(msgspec.Struct):
    data: list[ModelCard]
    object: str = "list"


class ResponseMessage(msgspec.Struct):
    content: str
    role: str = "assistant"


class ChatLogProb(msgspec.Struct):
    token: str
    logprob: float
    bytes: list[int]


class ChatLogProbsContent(msgspec.Struct):
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[ChatLogProb]


class ChatCompletionLogProbs(msgspec.Struct):
    content: list[ChatLogProbsContent]


class CompletionLogProbs(msgspec.Struct):
    text_offset: list[int]
    token_logprobs: list[float | None]
    tokens: list[str]
    top_logprobs: list[dict[str, float] | None]


class ChatCompletionChoice(msgspec.Struct):
    index: int
    message: ResponseMessage
    finish_reason: str | None
    logprobs: ChatCompletionLogProbs | None = None


class ChatCompletionResponse(msgspec.Struct):
    id: str
    model: str
    choices: list[ChatCompletionChoice]
    usage: UsageInfo
    created: int = msgspec.field(default_factory=lambda: int(time.time()))
    object: str = "chat.completion"


class DeltaMessage(msgspec.Struct):
    role: str | msgspec.UnsetType = msgspec.UNSET
    content: str | msgspec.UnsetType = msgspec.UNSET


class ChatCompletionStreamChoice(msgspec.Struct):
    index: int
    delta: DeltaMessage
    finish_reason: str | None = None
    logprobs: ChatCompletionLogProbs | None = None


class ChatCompletionStreamResponse(msgspec.Struct):
    id: str
    model: str
    created: int
    choices: list[ChatCompletionStreamChoice]
    usage: UsageInfo | msgspec.UnsetType = msgspec.UNSET
    object: str = "chat.completion.chunk"


class CompletionChoice(msgspec.Struct):
    index: int
    text: str
    finish_reason: str | None = None
    logprobs: CompletionLogProbs | None = None


class CompletionResponse(msgspec.Struct):
    id: str
    model: str
    created: int
    choices: list[CompletionChoice]
    usage: UsageInfo | msgspec.UnsetType = msgspec.UNSET
    object: str = "text_completion"


_encoder = msgspec.json.Encoder()


def to_json(body: msgspec.Struct) -> bytes:
    return _encoder.encode(body)
