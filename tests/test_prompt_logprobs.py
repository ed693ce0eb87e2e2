"""Prompt logprobs (what `echo` with `logprobs` shows) computed chunk by chunk during the
prefill, as vLLM does, instead of in one pass over the whole prompt: each position's logprob of
the next prompt token, its top ones and its rank equal a log-softmax over the logits of one
unchunked scoring pass, whatever the chunk size, across a preemption, next to other requests,
with prefix caching on, and at TP=2."""

import numpy as np
import pytest

from minivllm import LLM
from minivllm.sampling_params import SamplingParams

PROMPT = [(11 * j) % 300 + 3 for j in range(100)]
TOP = 3


def reference(llm, prompt):
    """(ids, logprobs, rank) per position from one unchunked pass (Worker.prompt_logprobs)."""
    entries = llm.engine_core.call_utility("collective_rpc", "prompt_logprobs", [prompt, TOP])[0]
    ids, lps, ranks = zip(*entries[1:])
    return list(map(list, ids)), np.array(lps), list(ranks)


def check(out, ref):
    got = out.prompt_logprobs
    assert got[0] is None and len(got) == len(PROMPT), "one entry per prompt token, None first"
    ids, lps, ranks = zip(*got[1:])
    assert list(map(list, ids)) == ref[0]
    assert list(ranks) == ref[2]
    np.testing.assert_allclose(np.array(lps), ref[1], atol=2e-4)


@pytest.mark.parametrize("engine_args", [
    dict(max_num_batched_tokens=32),  # the prompt in 4 chunks, one step each
    dict(max_num_batched_tokens=512, enable_prefix_caching=True),
], ids=["chunks_of_32", "one_chunk_prefix_cached"])
def test_prompt_logprobs_equal_one_unchunked_pass(tiny_dir, engine_args):
    with LLM(tiny_dir, **engine_args) as llm:
        ref = reference(llm, PROMPT)
        params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True,
                                prompt_logprobs=TOP)
        plain = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
        for _ in range(2):  # the second time the prompt is in the prefix cache, if it is on
            outs = llm.generate([PROMPT, PROMPT[:40], PROMPT], [params, plain, plain],
                                use_tqdm=False)
            check(outs[0], ref)
            assert outs[1].prompt_logprobs is None


def test_prompt_logprobs_survive_a_preemption(tiny_dir):
    """A KV cache too small for the batch preempts requests mid-prompt; a rerun prompt does not
    send its positions twice."""
    with LLM(tiny_dir, max_num_batched_tokens=32, num_kv_blocks=12) as llm:
        ref = reference(llm, PROMPT)
        params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True,
                                prompt_logprobs=TOP)
        outs = llm.generate([PROMPT] * 3, params, use_tqdm=False)
        assert llm.engine_core.call_utility("get_stats")["num_preemptions"] > 0
        for out in outs:
            check(out, ref)


def test_prompt_logprobs_at_tp2(tiny_dir_tp2):
    with LLM(tiny_dir_tp2, tensor_parallel_size=2, max_num_batched_tokens=32) as llm:
        ref = reference(llm, PROMPT)
        out = llm.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=2,
                                                    prompt_logprobs=TOP), use_tqdm=False)[0]
        check(out, ref)
