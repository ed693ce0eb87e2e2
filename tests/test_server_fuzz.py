"""A fuzzed API boundary: hypothesis sends hostile bodies for every field of /v1/completions and
/v1/chat/completions to a real `minivllm serve`, and each answer must be 200 or an OpenAI-style
4xx; afterwards the server is healthy and a greedy reference request returns the same text it
returned before. scripts/fuzz_server.py runs the same strategies for longer.

The server runs the tiny model with a 128-token context, so no example generates for long.
"""

from __future__ import annotations

import httpx
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from server_fuzz_requests import chat_bodies, check_answer, completion_bodies, encode

from minivllm.entrypoints.openai.server_process import ServerProcess

EXAMPLES = 25  # per endpoint: about 10 s each on a quiet machine
REFERENCE = {"prompt": "The capital of France", "max_tokens": 12, "temperature": 0,
             "ignore_eos": True}
ANSWER_TIMEOUT_S = 60.0  # no answer this long is a hang (a whole answer takes well under 1 s)
FUZZ_SETTINGS = settings(max_examples=EXAMPLES, deadline=None, database=None,
                         suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                HealthCheck.too_slow],
                         derandomize=True,  # the same examples every run: no flaky suite
                         phases=[Phase.explicit, Phase.generate])  # a hang shrinks slowly


@pytest.fixture(scope="module")
def server(tiny_dir):
    with ServerProcess([tiny_dir, "--served-model-name", "tiny", "--max-model-len", "128"]
                       ) as proc:
        yield proc


def reference_text(url: str) -> str:
    r = httpx.post(url + "/v1/completions", json=REFERENCE, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def post(server, path: str, body: dict) -> None:
    try:
        r = httpx.post(server.url + path, content=encode(body), timeout=ANSWER_TIMEOUT_S,
                       headers={"Content-Type": "application/json"})
    except httpx.TimeoutException:
        pytest.fail(f"no answer within {ANSWER_TIMEOUT_S:g} s to {encode(body)[:600]!r}")
    problem = check_answer(r.status_code, r.headers, r.content, body)
    assert problem is None, f"{problem}\nrequest: {encode(body)[:600]!r}"
    assert server.returncode is None, server.output()[-3000:]


@pytest.fixture(scope="module")
def reference(server) -> str:
    return reference_text(server.url)


def test_fuzzed_completions_get_200_or_an_openai_4xx(server, reference):
    @FUZZ_SETTINGS
    @given(completion_bodies())
    def run(body):
        post(server, "/v1/completions", body)
    run()
    assert_unharmed(server, reference)


def test_fuzzed_chat_completions_get_200_or_an_openai_4xx(server, reference):
    @FUZZ_SETTINGS
    @given(chat_bodies())
    def run(body):
        post(server, "/v1/chat/completions", body)
    run()
    assert_unharmed(server, reference)


def assert_unharmed(server, reference: str) -> None:
    assert httpx.get(server.url + "/health", timeout=30).status_code == 200
    assert reference_text(server.url) == reference
    metrics = httpx.get(server.url + "/metrics", timeout=30).text
    assert 'finished_reason="error",model_name="tiny"} 0.0' in metrics, \
        [line for line in metrics.splitlines() if "error" in line]
    assert "Traceback" not in server.output(), server.output()[-3000:]


def post_json(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, content=encode(body), timeout=60,
                      headers={"Content-Type": "application/json"})


@pytest.mark.parametrize("field, value, words", [
    ("presence_penalty", 99, "Invalid 'presence_penalty': integer above maximum value. "
                             "Expected a value <= 2, but got 99 instead."),
    ("frequency_penalty", -2.5, "Invalid 'frequency_penalty': decimal below minimum value. "
                                "Expected a value >= -2, but got -2.5 instead."),
    ("temperature", float("nan"), "Invalid 'temperature': expected a finite number"),
    ("top_p", 0, "Expected a value > 0, but got 0 instead."),
    ("repetition_penalty", 0, "Expected a value > 0"),
    ("top_k", 2**70, "(a top_k at or above the vocabulary's size keeps every token)"),
    ("seed", 2**64, "Expected a value <= 9223372036854775807"),
    ("best_of", 2, "Unsupported parameter: 'best_of'"),
    ("suffix", "x", "Unsupported parameter: 'suffix'"),
    ("response_format", {"type": "json_object"}, "Unsupported parameter: 'response_format'"),
    ("logit_bias", {"384": 5}, "out-of-vocab token ids. Vocabulary size: 384"),
    ("min_tokens", 9, "min_tokens must be less than or equal to max_tokens=4"),
    ("stop", [""], "stop cannot contain an empty string."),
])
def test_out_of_range_and_unsupported_values_are_400_naming_the_field(server, field, value,
                                                                      words):
    r = post_json(server, "/v1/completions", {"prompt": "Hello", "max_tokens": 4, field: value})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == field and words in err["message"], err


def test_do_nothing_values_of_unsupported_fields_and_extreme_valid_values_run(server):
    """Each used to kill the engine core: a top_k past int32, and a repetition penalty that a
    float32 turns into 0 (scripts/fuzz_server.py found it)."""
    for extra in ({"best_of": 1}, {"suffix": None}, {"response_format": {"type": "text"}},
                  {"top_k": 2**31, "temperature": 1}, {"top_k": 2**63 - 1, "temperature": 1},
                  {"repetition_penalty": 1e-300, "temperature": 1},
                  {"repetition_penalty": 1e300, "temperature": 0},
                  {"user": "someone", "no_such_field": 1}):
        r = post_json(server, "/v1/completions", {"prompt": "Hello", "max_tokens": 2, **extra})
        assert r.status_code == 200, (extra, r.text)


def test_penalties_and_logit_bias_reach_the_sampler(server):
    """Mapped into SamplingParams: a +100 bias makes greedy pick that token every time, and
    a frequency penalty changes a greedy text that repeats itself."""
    base = {"prompt": "The capital of France", "max_tokens": 12, "temperature": 0,
            "ignore_eos": True, "return_tokens_as_token_ids": True, "logprobs": 0}
    r = post_json(server, "/v1/completions", {**base, "logit_bias": {"42": 100}})
    assert r.json()["choices"][0]["logprobs"]["tokens"] == ["token_id:42"] * 12, r.text
    plain = post_json(server, "/v1/completions", base).json()["choices"][0]["logprobs"]
    assert len(set(plain["tokens"])) < 12, "the reference text does not repeat a token"
    penalized = post_json(server, "/v1/completions", {**base, "frequency_penalty": 2})
    assert penalized.json()["choices"][0]["logprobs"]["tokens"] != plain["tokens"]


def test_a_refused_top_k_is_no_engine_error_in_metrics(server):
    def errors() -> str:
        text = httpx.get(server.url + "/metrics", timeout=30).text
        return [line for line in text.splitlines() if 'finished_reason="error"' in line][0]
    before = errors()
    r = post_json(server, "/v1/completions", {"prompt": "Hello", "top_k": 2**70})
    assert r.status_code == 400 and r.json()["error"]["param"] == "top_k", r.text
    assert errors() == before
