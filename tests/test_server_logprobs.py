"""logprobs, top_logprobs and echo through `minivllm serve` (tiny model), checked against a
log-softmax of the same model's logits computed here, in the test's own process.

The engine computes logprobs from the raw logits that sampled each token (vLLM's default
"raw_logprobs"), so a sampled request at temperature 0.7 still reports the model's own
distribution. Tokens come back as "token_id:<id>" (return_tokens_as_token_ids) so the test
knows exactly which ids were sampled.
"""

from __future__ import annotations

import openai
import pytest
import torch

from minivllm.entrypoints.openai.server_process import ServerProcess

from minivllm.model.llama import LlamaModel
from minivllm.model.loader import load_config, load_weights
from minivllm.tokenizer import Tokenizer
from tiny_model import make_tiny_model_dir

PROMPT = [5, 17, 42, 99, 7]
ATOL = 1e-4  # float32 logits of one sequence alone vs. in the server's batch
SAMPLED = dict(temperature=0.7, seed=11, max_tokens=6,
               extra_body={"ignore_eos": True, "return_tokens_as_token_ids": True})


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_model_dir(str(tmp_path_factory.mktemp("tiny")))


@pytest.fixture(scope="module")
def server(tiny):
    with ServerProcess([tiny, "--served-model-name", "tiny"]) as proc:
        yield proc


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


@pytest.fixture(scope="module")
def reference(tiny):
    """Log-softmax of the model's logits at every position of a sequence."""
    config = load_config(tiny)
    model = LlamaModel(config, load_weights(tiny, config))

    def logprobs(ids: list[int]) -> torch.Tensor:
        with torch.inference_mode():
            return torch.log_softmax(model.score(ids).float(), dim=-1)
    return logprobs


def ids_of(tokens: list[str]) -> list[int]:
    assert all(t.startswith("token_id:") for t in tokens), tokens
    return [int(t.split(":")[1]) for t in tokens]


def check_position(ref_row: torch.Tensor, token: int, logprob: float, top: dict[str, float],
                   num_top: int) -> None:
    """The sampled token's logprob, and the top ones: the sampled token and the top num_top."""
    assert logprob == pytest.approx(float(ref_row[token]), abs=ATOL)
    want = {token, *ref_row.topk(num_top).indices.tolist()}
    assert set(ids_of(list(top))) == want
    for t, v in zip(ids_of(list(top)), top.values()):
        assert v == pytest.approx(float(ref_row[t]), abs=ATOL)


def test_completion_logprobs_are_the_models(client, reference):
    out = client.completions.create(model="tiny", prompt=PROMPT, logprobs=3, **SAMPLED)
    lp = out.choices[0].logprobs
    sampled = ids_of(lp.tokens)
    ref = reference(PROMPT + sampled)[len(PROMPT) - 1:-1]
    for j, token in enumerate(sampled):
        check_position(ref[j], token, lp.token_logprobs[j], lp.top_logprobs[j], 3)
    assert lp.text_offset == [sum(map(len, lp.tokens[:j])) for j in range(len(sampled))]
    streamed = list(client.completions.create(model="tiny", prompt=PROMPT, logprobs=3,
                                              stream=True, **SAMPLED))
    tokens = [t for c in streamed for t in c.choices[0].logprobs.tokens]
    values = [v for c in streamed for v in c.choices[0].logprobs.token_logprobs]
    assert tokens == lp.tokens and values == pytest.approx(lp.token_logprobs, abs=1e-6)


def test_chat_logprobs_streamed_and_whole(client, reference, tiny):
    messages = [{"role": "user", "content": "The capital of France"}]
    tok = Tokenizer.from_path(tiny)
    prompt = tok.encode(tok.apply_chat_template(messages))
    whole = client.chat.completions.create(model="tiny", messages=messages, logprobs=True,
                                           top_logprobs=2, **SAMPLED)
    content = whole.choices[0].logprobs.content
    sampled = ids_of([c.token for c in content])
    ref = reference(prompt + sampled)[len(prompt) - 1:-1]
    for j, c in enumerate(content):
        assert c.logprob == pytest.approx(float(ref[j, sampled[j]]), abs=ATOL)
        assert len(c.top_logprobs) == 2 and c.bytes == list(c.token.encode())
        # vLLM's order: the sampled token first, then the most likely others
        expected = list(dict.fromkeys([sampled[j], *ref[j].topk(2).indices.tolist()]))[:2]
        assert ids_of([t.token for t in c.top_logprobs]) == expected
    chunks = list(client.chat.completions.create(model="tiny", messages=messages,
                                                 logprobs=True, top_logprobs=2, stream=True,
                                                 **SAMPLED))
    streamed = [c for ch in chunks if ch.choices and ch.choices[0].logprobs
                for c in ch.choices[0].logprobs.content]
    assert [c.token for c in streamed] == [c.token for c in content]
    plain = client.chat.completions.create(model="tiny", messages=messages, **SAMPLED)
    assert plain.choices[0].logprobs is None


def test_echo_with_prompt_logprobs(client, reference):
    out = client.completions.create(model="tiny", prompt=PROMPT, echo=True, logprobs=2,
                                    **SAMPLED)
    lp = out.choices[0].logprobs
    ids = ids_of(lp.tokens)
    assert ids[:len(PROMPT)] == PROMPT and len(ids) == len(PROMPT) + 6
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    ref = reference(ids)
    for j in range(1, len(ids)):
        check_position(ref[j - 1], ids[j], lp.token_logprobs[j], lp.top_logprobs[j], 2)
    text = client.completions.create(model="tiny", prompt="The capital of", echo=True,
                                     max_tokens=3, temperature=0)
    assert text.choices[0].text.startswith("The capital of")
    chunks = list(client.completions.create(model="tiny", prompt="The capital of", echo=True,
                                            max_tokens=3, temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == text.choices[0].text


@pytest.mark.parametrize("kwargs, param", [
    (dict(prompt="x", logprobs=21), "logprobs"),
    (dict(prompt="x", logprobs=-2), "logprobs"),
    (dict(prompt="x", logprobs=-1), "logprobs"),  # -1: the whole vocabulary, over 20
    (dict(messages=[{"role": "user", "content": "x"}], logprobs=True, top_logprobs=21),
     "logprobs"),
    (dict(messages=[{"role": "user", "content": "x"}], top_logprobs=3), "top_logprobs"),
])
def test_logprobs_limits_are_vllms(client, kwargs, param):
    create = client.completions.create if "prompt" in kwargs else client.chat.completions.create
    with pytest.raises(openai.BadRequestError) as e:
        create(model="tiny", max_tokens=2, **kwargs)
    assert e.value.body["param"] == param, e.value.body
