"""Hypothesis strategies for hostile /v1/completions and /v1/chat/completions bodies, and the
check that an answer is what an OpenAI server may answer. Used by test_server_fuzz.py (a few
dozen examples) and scripts/fuzz_server.py (as many as you like).

Every field either endpoint knows (minivllm's, vLLM's and OpenAI's) gets values of three
kinds: valid ones, the edges of its range and past them (NaN, 2**70, -1), and the wrong type.
An answer must be 200 or an OpenAI-style 4xx ({"error": {message, type, param, code}}, code ==
status); a 200 stream must be JSON events ending with [DONE] and carry no error event.
"""

from __future__ import annotations

import json
import math

from hypothesis import strategies as st

BIG = [2**31, 2**32, 2**63 - 1, 2**63, 2**64, 2**70, -2**63 - 1]
junk = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from(BIG),
                 st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=4),
                 st.lists(st.integers(-2, 5), max_size=3),
                 st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


def ints(lo: int, hi: int, bad: tuple = ()) -> tuple:
    """(valid, hostile): [lo, hi], and its edges, int64's and the wrong types."""
    return (st.integers(lo, hi),
            st.one_of(st.sampled_from(BIG + [lo - 1, hi + 1, *bad]), junk))


def floats(lo: float, hi: float) -> tuple:
    return (st.floats(lo, hi),
            st.one_of(st.sampled_from([lo - 1e-6, hi + 1e-6, 99.0, -99.0, math.nan, math.inf,
                                       -math.inf, 2**70]), junk))


def noop_or(values: list, hostile: list) -> tuple:
    """An unsupported field: its do-nothing values pass, the rest are refused."""
    return st.sampled_from(values), st.one_of(st.sampled_from(hostile), junk)


text = st.text(st.characters(codec="utf-8"), max_size=40)
nasty_text = st.sampled_from(["", "\ud800", "\x00", "<|im_end|>", "é" * 300, " " * 50])
valid_ids = st.lists(st.integers(0, 383), min_size=1, max_size=6)
bad_ids = st.lists(st.sampled_from([-1, 384, 10**6, 2**70]), min_size=1, max_size=3)
logit_bias = st.dictionaries(st.integers(0, 383).map(str), st.floats(-200, 200), max_size=3)
bad_logit_bias = st.dictionaries(st.sampled_from(["x", "-1", "384", str(2**70), "1.5"]),
                                 st.floats(allow_nan=True), min_size=1, max_size=2)
stream_options = st.fixed_dictionaries({}, optional={"include_usage": st.booleans(),
                                                     "continuous_usage_stats": st.booleans()})

SHARED = {  # name: (valid values, hostile values)
    "model": (st.just("tiny"), st.one_of(st.just("other"), junk)),
    "user": (text, junk),
    "n": ints(1, 2), "temperature": floats(0.0, 2.0), "top_p": floats(0.01, 1.0),
    "top_k": (st.one_of(st.integers(-1, 500), st.sampled_from([2**31, 2**63 - 1])),
              st.one_of(st.sampled_from([-2, 2**63, 2**70, 1.5]), junk)),
    "presence_penalty": floats(-2.0, 2.0), "frequency_penalty": floats(-2.0, 2.0),
    "repetition_penalty": (st.floats(0.01, 3.0), st.one_of(st.sampled_from(
        [0.0, -1.0, math.nan, math.inf]), junk)),
    "logit_bias": (logit_bias, st.one_of(bad_logit_bias, junk)),
    "min_tokens": ints(0, 1), "seed": (st.one_of(st.integers(-1, 10**6), st.sampled_from(
        [2**63 - 1, -2**63])), st.one_of(st.sampled_from([2**63, 2**70]), junk)),
    "stop": (st.one_of(text.filter(bool), st.lists(text.filter(bool), max_size=3)),
             st.one_of(nasty_text, st.lists(nasty_text, min_size=1, max_size=3), junk)),
    "stop_token_ids": (st.lists(st.integers(0, 383), max_size=3), st.one_of(bad_ids, junk)),
    "ignore_eos": (st.booleans(), junk), "stream": (st.booleans(), junk),
    "stream_options": (stream_options, junk),
    "return_tokens_as_token_ids": (st.booleans(), junk),
    "max_tokens": (st.integers(1, 4), st.one_of(st.sampled_from([0, -1, 10**6, 2**70]), junk)),
    "best_of": noop_or([None, 1], [2, 0]),
    "response_format": noop_or([None, {"type": "text"}], [{"type": "json_object"}]),
    "min_p": noop_or([None, 0.0], [0.5]), "use_beam_search": noop_or([False], [True]),
    "priority": noop_or([0], [1, -1]), "no_such_field": (junk, junk),
}
COMPLETION = {
    **SHARED,
    "prompt": (st.one_of(text.filter(str.strip), valid_ids,
                         st.lists(text.filter(str.strip), min_size=1, max_size=2),
                         st.lists(valid_ids, min_size=1, max_size=2)),
               st.one_of(nasty_text, bad_ids, st.just([]), st.just([[]]),
                         st.lists(nasty_text, max_size=3), st.just(["a"] * 1100), junk)),
    "logprobs": ints(0, 20, (-1,)), "echo": (st.booleans(), junk),
    "suffix": noop_or([None, ""], ["x"]),
}
message = st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant"]),
                                 "content": text})
bad_message = st.fixed_dictionaries(
    {"role": st.one_of(text, junk),
     "content": st.one_of(nasty_text, st.lists(st.fixed_dictionaries(
         {"type": st.sampled_from(["text", "image_url"]), "text": text}), max_size=2), junk)})
CHAT = {
    **SHARED,
    "messages": (st.lists(message, min_size=1, max_size=3),
                 st.one_of(st.lists(bad_message, max_size=3), junk)),
    "logprobs": (st.booleans(), junk), "top_logprobs": ints(0, 20, (-1,)),
    "max_completion_tokens": (st.integers(1, 4), st.one_of(st.sampled_from([0, 2**70]), junk)),
    "tools": noop_or([None, []], [[{"type": "function"}]]),
    "tool_choice": noop_or([None, "none"], ["required"]),
}


@st.composite
def bodies(draw, fields: dict, required: str) -> dict:
    """A valid body (the required field, a few tokens' max_tokens, any subset of the others),
    then zero to two of its fields, present or not, given hostile values."""
    always = {required: fields[required][0], "max_tokens": fields["max_tokens"][0]}
    optional = {k: valid for k, (valid, _) in fields.items() if k not in always}
    body = draw(st.fixed_dictionaries(always, optional=optional))
    for name in draw(st.lists(st.sampled_from(sorted(fields)), max_size=2, unique=True)):
        body[name] = draw(fields[name][1])
    return body


def completion_bodies() -> st.SearchStrategy:
    return bodies(COMPLETION, "prompt")


def chat_bodies() -> st.SearchStrategy:
    return bodies(CHAT, "messages")


def encode(body: dict) -> bytes:
    """JSON as a careless client sends it: NaN and Infinity as bare words, lone surrogates
    escaped."""
    return json.dumps(body, allow_nan=True).encode()


def check_answer(status: int, headers: dict, content: bytes, body: dict) -> str | None:
    """Why this answer is not one an OpenAI server may give; None if it is."""
    if status == 200:
        if headers.get("content-type", "").startswith("text/event-stream"):
            return check_stream(content)
        choices = json.loads(content).get("choices")
        return None if isinstance(choices, list) and choices else f"no choices: {content[:300]}"
    if not 400 <= status < 500 or status in (422,):
        return f"status {status}: {content[:500]!r}"
    try:
        err = json.loads(content)["error"]
    except (ValueError, KeyError, TypeError):
        return f"{status} without OpenAI's error body: {content[:300]!r}"
    if not (isinstance(err.get("message"), str) and err["message"] and "type" in err
            and "param" in err and err.get("code") == status):
        return f"{status} with a malformed error: {err}"
    return None


def check_stream(content: bytes) -> str | None:
    events = [line[6:] for line in content.decode().split("\n") if line.startswith("data: ")]
    if not events or events[-1] != "[DONE]":
        return f"a stream that does not end with [DONE]: {content[-300:]!r}"
    for event in events[:-1]:
        data = json.loads(event)
        if "error" in data:
            return f"an error event in a 200 stream: {event[:400]}"
    return None
