"""Logprobs in OpenAI's two response shapes, from what the engine computed per token.

The engine sends, per sampled token, the sampled token's logprob and rank and the top K
(model/sampler.py: compute_logprobs, from the raw logits that sampled it). Completions show
each position's sampled token plus the top `logprobs` (up to logprobs + 1 entries, OpenAI's
convention); chat shows the first `top_logprobs` of the same list, the sampled token first.
Logprobs of -inf are written as -9999.0, as OpenAI and vLLM do. Echoed prompt tokens get their
logprobs from the engine, computed chunk by chunk during the prefill
(SamplingParams.prompt_logprobs); the first has none. In vLLM:
_create_completion_logprobs, vllm/entrypoints/openai/completion/serving.py (OpenAIServingCompletion._create_completion_logprobs);
_create_chat_logprobs, vllm/entrypoints/openai/chat_completion/serving.py (OpenAIServingChat._create_chat_logprobs); the limits,
vllm/sampling_params.py (SamplingParams._validate_logprobs) and
vllm/entrypoints/openai/chat_completion/protocol.py (ChatCompletionRequest.check_logprobs).
"""

from __future__ import annotations


import numpy as np

from minivllm.engine.output_processor import TokenLogprobs
from minivllm.entrypoints.openai.protocol import (ChatCompletionLogProbs, ChatLogProb,
                                                  ChatLogProbsContent, CompletionLogProbs)
from minivllm.entrypoints.openai.serving_engine import OpenAIError
from minivllm.tokenizer import Tokenizer

MAX_LOGPROBS = 20  # vLLM's default max_logprobs (vllm/config/model.py (ModelConfig))
LOGPROB_FLOOR = -9999.0  # what a -inf logprob is written as: JSON has no infinity


def token_text(tokenizer: Tokenizer | None, token_id: int) -> str:
    """The token's text; with no tokenizer (return_tokens_as_token_ids), vLLM's
    "token_id:<id>" (format_token_id_placeholder), which tells equal-looking tokens apart."""
    if tokenizer is None:
        return f"token_id:{token_id}"
    return tokenizer.decode([token_id], skip_special_tokens=False)


def _entries(tokenizer: Tokenizer | None, lp: TokenLogprobs, limit: int) -> dict[str, float]:
    """The first `limit` distinct tokens of (sampled, top...), as text -> logprob."""
    out: dict[int, float] = {}
    for tid, value in zip(*lp[:2]):
        if len(out) == limit:
            break
        out.setdefault(tid, value)
    return {token_text(tokenizer, t): max(v, LOGPROB_FLOOR) for t, v in out.items()}


def completion_logprobs(tokenizer: Tokenizer | None, token_ids: list[int],
                        logprobs: list[TokenLogprobs | None], num: int,
                        text_offset: int = 0) -> CompletionLogProbs:
    tokens = [token_text(tokenizer, t) for t in token_ids]
    offsets = list(np.cumsum([text_offset] + [len(t) for t in tokens[:-1]])) if tokens else []
    return CompletionLogProbs(
        text_offset=[int(o) for o in offsets],
        token_logprobs=[None if lp is None else max(lp[1][0], LOGPROB_FLOOR) for lp in logprobs],
        tokens=tokens,
        top_logprobs=[None if lp is None else _entries(tokenizer, lp, num + 1)
                      for lp in logprobs])


def chat_logprobs(tokenizer: Tokenizer | None, token_ids: list[int], logprobs: list[TokenLogprobs],
                  num: int) -> ChatCompletionLogProbs:
    def item(text: str, value: float) -> ChatLogProb:
        return ChatLogProb(text, max(value, LOGPROB_FLOOR), list(text.encode("utf-8", "replace")))
    content = []
    for tid, lp in zip(token_ids, logprobs):
        first = item(token_text(tokenizer, tid), lp[1][0])
        top = [item(t, v) for t, v in _entries(tokenizer, lp, num).items()]
        content.append(ChatLogProbsContent(first.token, first.logprob, first.bytes, top))
    return ChatCompletionLogProbs(content)


def check_num_logprobs(num: int | None, vocab_size: int, param: str) -> int | None:
    """vLLM's limits: a negative count other than -1 (all) is refused, and so is more than
    MAX_LOGPROBS. Returns the count for the engine."""
    if num is None:
        return None
    if num < 0 and num != -1:
        raise OpenAIError(f"`{param}` must be a positive value or -1.", param=param)
    wanted = vocab_size if num == -1 else num
    if wanted > MAX_LOGPROBS:
        raise OpenAIError(f"Requested sample logprobs of {wanted}, which is greater than max "
                          f"allowed: {MAX_LOGPROBS}", param="logprobs")
    return wanted
