"""What the API refuses before a request reaches the engine, and how it says so.

Ranges are vLLM's (vllm/sampling_params.py, SamplingParams._verify_args and
SamplingParams._validate_logit_bias; the seed's int64, CompletionRequest.seed), written as
pydantic bounds on the request models (protocol.py). A value out of range is answered in
OpenAI's own words, e.g. "Invalid 'presence_penalty': decimal above maximum value. Expected a
value <= 2, but got 99 instead."; a NaN or infinity as "expected a finite number".

Fields that vLLM's or OpenAI's API defines and minivllm does not implement are refused (400,
naming the field) unless they hold their do-nothing value (`best_of: 1`, `suffix: null`,
`response_format: {"type": "text"}`), which some clients always send. Fields that neither API
defines are ignored, as vLLM ignores them (OpenAIBaseModel's extra="allow").
"""

from __future__ import annotations

import math
import os
from typing import Any

from minivllm.entrypoints.openai.errors import OpenAIError

INT64_MIN, INT64_MAX = -2**63, 2**63 - 1
# vLLM's VLLM_MAX_COMPLETION_PROMPTS (vllm/envs.py; the check is
# CompletionRequest.validate_prompt_list_length): prompts in one /v1/completions batch.
MAX_PROMPTS_ENV = "VLLM_MAX_COMPLETION_PROMPTS"
DEFAULT_MAX_PROMPTS = 1024

_NONE = (None,)
# field -> the values that change nothing; any other value is refused
UNSUPPORTED_BOTH: dict[str, tuple] = {
    "response_format": (None, {"type": "text"}), "structured_outputs": _NONE,
    "use_beam_search": (None, False), "length_penalty": (None, 1, 1.0),
    "min_p": (None, 0, 0.0), "watermarking": (None, False),
    "include_stop_str_in_output": (None, False), "skip_special_tokens": (None, True),
    "spaces_between_special_tokens": (None, True), "truncate_prompt_tokens": _NONE,
    "truncation_side": _NONE, "allowed_token_ids": _NONE, "prompt_logprobs": _NONE,
    "logprob_token_ids": _NONE, "bad_words": (None, []), "priority": (None, 0),
    "request_id": _NONE, "session_id": _NONE, "return_token_ids": (None, False),
    "return_weight_versions": (None, False), "return_token_offsets": (None, False),
    "mm_payload": _NONE, "return_mm_kwargs": (None, False), "cache_salt": _NONE,
    "kv_transfer_params": _NONE, "ec_transfer_params": _NONE, "vllm_xargs": _NONE,
    "repetition_detection": _NONE, "thinking_token_budget": _NONE,
    "stream_interval": (None, 1), "routed_experts_prompt_start": (None, 0),
    "prediction": _NONE, "service_tier": (None, "auto", "default"), "metadata": _NONE,
    "store": (None, False),
}
UNSUPPORTED_COMPLETION = {**UNSUPPORTED_BOTH, "suffix": (None, ""), "best_of": (None, 1),
                          "prompt_embeds": _NONE}
UNSUPPORTED_CHAT = {
    **UNSUPPORTED_BOTH, "best_of": (None, 1), "tools": (None, []), "functions": (None, []),
    "tool_choice": (None, "none", "auto"), "function_call": (None, "none", "auto"),
    "parallel_tool_calls": (None, True, False), "reasoning_effort": _NONE,
    "documents": _NONE, "chat_template": _NONE, "chat_template_kwargs": (None, {}),
    "media_io_kwargs": _NONE, "mm_processor_kwargs": _NONE, "echo": (None, False),
    "add_generation_prompt": (None, True), "continue_final_message": (None, False),
    "return_prompt_text": (None, False), "modalities": (None, ["text"]), "audio": _NONE,
    "web_search_options": _NONE, "verbosity": _NONE,
}


def check_unsupported(extra: dict[str, Any] | None, table: dict[str, tuple]) -> None:
    """400 naming the first field this server does not implement that would change the
    answer."""
    for name, value in (extra or {}).items():
        noop = table.get(name)
        if noop is not None and not any(value == v and type(value) is type(v) or
                                        value is v for v in noop):
            raise OpenAIError(f"Unsupported parameter: '{name}' is not supported by this "
                              f"server (minivllm); remove it, or send one of {list(noop)}",
                              param=name)


def max_prompts() -> int:
    value = os.environ.get(MAX_PROMPTS_ENV, "")
    return int(value) if value.isdigit() else DEFAULT_MAX_PROMPTS


def check_prompt_count(count: int) -> None:
    """vLLM's cap on a batch of prompts, with its message and its variable."""
    limit = max_prompts()
    if count > limit:
        raise OpenAIError(f"prompt list length {count} exceeds the maximum allowed count of "
                          f"{limit}. To increase this limit, set the {MAX_PROMPTS_ENV} "
                          f"environment variable.", param="prompt")


def logit_bias_ids(bias: dict[str, float] | None, vocab_size: int) -> dict[int, float]:
    """{token id: bias}: keys must name tokens of the vocabulary (vLLM's
    SamplingParams._validate_logit_bias); SamplingParams clamps the biases to [-100, 100]."""
    out: dict[int, float] = {}
    for key, value in (bias or {}).items():
        try:
            token = int(key)
        except ValueError:
            raise OpenAIError(f"logit_bias contains a key that is not a token id: {key!r}",
                              param="logit_bias") from None
        if not 0 <= token < vocab_size:
            raise OpenAIError(f"token_id(s) [{token}] in logit_bias contain out-of-vocab token "
                              f"ids. Vocabulary size: {vocab_size}", param="logit_bias")
        out[token] = value
    return out


def check_min_tokens(min_tokens: int, max_tokens: int) -> None:
    """vLLM's SamplingParams._verify_args: min_tokens <= max_tokens (the max after clamping to
    the room the prompt leaves, as vLLM compares it)."""
    if min_tokens > max_tokens:
        raise OpenAIError(f"min_tokens must be less than or equal to max_tokens={max_tokens}, "
                          f"got {min_tokens}.", param="min_tokens")


def _number(value: Any) -> str:
    if isinstance(value, float) and value.is_integer() and math.isfinite(value):
        return str(int(value))
    return str(value)


BOUND_WORDS = {"less_than_equal": ("above maximum", "<=", "le"),
               "less_than": ("above maximum", "<", "lt"),
               "greater_than_equal": ("below minimum", ">=", "ge"),
               "greater_than": ("below minimum", ">", "gt")}


def openai_wording(error: dict[str, Any]) -> str | None:
    """OpenAI's message for a pydantic range or finiteness error; None for other errors."""
    param = ".".join(str(p) for p in error.get("loc", ()))
    value, kind = error.get("input"), error.get("type")
    if kind == "finite_number":
        return f"Invalid '{param}': expected a finite number, but got {value} instead."
    if kind == "value_error":  # a check of ours: its own words
        return f"Invalid '{param}': {error.get('msg', '').removeprefix('Value error, ')}"
    if kind not in BOUND_WORDS:
        return None
    where, op, key = BOUND_WORDS[kind]
    bound = (error.get("ctx") or {}).get(key)
    number = "integer" if isinstance(value, int) else "decimal"
    hint = ""
    if param == "top_k" and where == "above maximum":
        hint = " (a top_k at or above the vocabulary's size keeps every token)"
    return (f"Invalid '{param}': {number} {where} value. Expected a value {op} "
            f"{_number(bound)}{hint}, but got {_number(value)} instead.")
