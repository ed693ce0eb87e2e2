"""Penalties, logit_bias and min_tokens as vLLM's sampler applies them, and a request's
sampling data never failing the engine for the others (a `top_k` of 2**31 must not overflow the
step's int32 array and kill the engine core).

The penalty arithmetic is checked against numbers worked by hand from vLLM's definitions
(model/penalties.py cites them); the rest runs through a real engine core process on the tiny
model: each setting changes the greedy tokens the way its definition says it must."""

import numpy as np
import pytest
import torch

from minivllm import LLM
from minivllm.engine.sampling_extras import pack_sampling_extras
from minivllm.engine.request import Request
from minivllm.model.penalties import apply_sampling_extras
from minivllm.sampling_params import SamplingParams

GREEDY = dict(temperature=0.0, max_tokens=6, ignore_eos=True)
PROMPT = [5, 9, 17, 33, 65, 129]


def test_penalties_match_vllms_definitions_worked_by_hand():
    """logits [2, -2, 1, 3]; prompt holds token 0, the output holds token 1 twice.
    repetition 2: token 0 (prompt) 2 -> 1, token 1 (output) -2 -> -4; token 3 untouched.
    frequency 0.5 and presence 0.25 only on the output: token 1 -4 - 2*0.5 - 0.25 = -5.25.
    logit_bias +1.5 on token 2: 1 -> 2.5."""
    params = SamplingParams(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25,
                            logit_bias={2: 1.5}, max_tokens=8)
    request = Request("r", np.array([0], np.int32), params, eos_token_id=3, block_size=16)
    request.append_output_token(1)
    request.append_output_token(1)
    extras = pack_sampling_extras([request], np.array([True]))
    logits = torch.tensor([[2.0, -2.0, 1.0, 3.0]])
    apply_sampling_extras(logits, extras, {0: 0})
    assert logits.tolist() == [[1.0, -5.25, 2.5, 3.0]]


def test_min_tokens_bans_the_stop_tokens_until_reached():
    params = SamplingParams(min_tokens=2, stop_token_ids=[2], max_tokens=8)
    request = Request("r", np.array([0], np.int32), params, eos_token_id=3, block_size=16)
    logits = torch.zeros(1, 5)
    apply_sampling_extras(logits, pack_sampling_extras([request], np.array([True])), {0: 0})
    assert logits.tolist() == [[0, 0, -np.inf, -np.inf, 0]]
    request.append_output_token(0)
    request.append_output_token(0)
    assert pack_sampling_extras([request], np.array([True])) is None  # nothing left to do


def test_plain_requests_send_no_extras():
    request = Request("r", np.array([0], np.int32), SamplingParams(), eos_token_id=3, block_size=16)
    assert pack_sampling_extras([request], np.array([True])) is None


@pytest.mark.parametrize("field, value, words", [
    ("presence_penalty", 2.5, "presence_penalty must be in \\[-2, 2\\]"),
    ("frequency_penalty", float("nan"), "frequency_penalty must be in \\[-2, 2\\]"),
    ("repetition_penalty", 0.0, "greater than zero"),
    ("min_tokens", 17, "min_tokens must be in \\[0, max_tokens=16\\]"),
    ("temperature", float("nan"), "temperature must be a finite number"),
])
def test_out_of_range_values_are_refused_with_vllms_ranges(field, value, words):
    with pytest.raises(ValueError, match=words):
        SamplingParams(**{field: value})


def test_logit_bias_is_clamped_to_plus_minus_100():
    assert SamplingParams(logit_bias={1: 1e9, 2: -1e9}).logit_bias == {1: 100.0, 2: -100.0}


@pytest.fixture(scope="module")
def llm(tiny_dir):
    with LLM(tiny_dir) as llm:
        yield llm


def tokens(llm, **kw):
    out = llm.generate([PROMPT], SamplingParams(**{**GREEDY, **kw}), use_tqdm=False)[0].outputs[0]
    return out.token_ids, out.finish_reason


def test_a_huge_top_k_is_no_top_k_and_the_engine_serves_on(llm):
    """vLLM clamps top_k at or above the vocabulary to the vocabulary; a seeded draw with it
    equals the same draw with no top-k at all."""
    sampled = dict(temperature=1.0, seed=7, max_tokens=6, ignore_eos=True)
    plain = llm.generate([PROMPT], SamplingParams(**sampled), use_tqdm=False)[0].outputs[0]
    for top_k in (384, 2**31, 2**63 - 1):  # the tiny model's vocabulary, past int32, int64's top
        out = llm.generate([PROMPT], SamplingParams(**sampled, top_k=top_k),
                           use_tqdm=False)[0].outputs[0]
        assert out.token_ids == plain.token_ids, f"top_k={top_k}"
    assert tokens(llm)[1] == "length"  # the engine core is still serving


def test_a_positive_bias_forces_its_token_and_a_negative_one_forbids_it(llm):
    reference, _ = tokens(llm)
    forced, _ = tokens(llm, logit_bias={42: 100.0})
    assert forced == [42] * 6
    avoided, _ = tokens(llm, logit_bias={reference[0]: -100.0})
    assert reference[0] not in avoided and avoided != reference


def test_min_tokens_holds_back_a_stop_token(llm):
    reference, _ = tokens(llm)
    stop = reference[0]
    stopped, reason = tokens(llm, stop_token_ids=[stop])
    assert stopped == [stop] and reason == "stop"
    held, _ = tokens(llm, stop_token_ids=[stop], min_tokens=3)
    assert stop not in held[:3] and len(held) >= 4


def test_a_repetition_penalty_changes_what_repeats(llm):
    reference, _ = tokens(llm, max_tokens=12)
    penalised, _ = tokens(llm, max_tokens=12, repetition_penalty=100.0)
    assert len(set(penalised)) == len(penalised), "a strong penalty repeats no token"
    assert not set(penalised) & set(PROMPT)
    assert penalised != reference or len(set(reference)) == len(reference)


def test_bad_sampling_data_fails_only_its_request(llm):
    """An out-of-vocabulary logit_bias id or more logprobs than the vocabulary: that request
    ends with an error, the others in the same call finish, and the engine serves on."""
    ok = SamplingParams(**GREEDY)
    for bad in (SamplingParams(**GREEDY, logit_bias={10**12: 1.0}),
                SamplingParams(**GREEDY, logprobs=10**6)):
        outs = llm.generate([PROMPT, PROMPT], [bad, ok], use_tqdm=False)
        assert outs[0].outputs[0].finish_reason == "error"
        assert len(outs[1].outputs[0].token_ids) == 6
    assert tokens(llm)[1] == "length"


def test_the_extras_reach_tensor_parallel_workers(tiny_dir_tp2):
    """At TP=2 the step crosses the shared-memory ring to worker processes: the packed extras
    travel with it and the output rank applies them."""
    with LLM(tiny_dir_tp2, tensor_parallel_size=2) as llm:
        forced, _ = tokens(llm, logit_bias={42: 100.0})
        held, _ = tokens(llm, stop_token_ids=[forced[0]], min_tokens=2, logit_bias={42: 100.0})
    assert forced == [42] * 6
    assert held[:2] != [42, 42] and 42 not in held[:2]


def test_a_row_whose_settings_raise_fails_alone():
    """A row whose packed settings cannot be applied is reported, and the other rows still get
    theirs (the worker then fails that request only)."""
    reqs = [Request(f"r{i}", np.array([0], np.int32), SamplingParams(logit_bias={1: 5.0}),
                    eos_token_id=3, block_size=16) for i in range(2)]
    extras = pack_sampling_extras(reqs, np.array([True, True]))
    extras.bias_values = extras.bias_values[:1]  # row 1's bias value is missing
    logits = torch.zeros(2, 4)
    failed = apply_sampling_extras(logits, extras, {0: 0, 1: 1})
    assert list(failed) == [1] and "sampling settings failed" in failed[1]
    assert logits[0].tolist() == [0, 5.0, 0, 0]


def test_a_tiny_repetition_penalty_is_applied_not_fatal(llm):
    """1e-300 is in vLLM's range (finite, > 0); as a float32 it would be 0 and 1/0 raised in the
    worker, which killed the engine core."""
    out, reason = tokens(llm, repetition_penalty=1e-300)
    assert reason == "length" and len(out) == 6
    assert tokens(llm)[1] == "length"
