"""minivllm.LLM end to end on the tiny model, and the "Paris" check on SmolLM2.

Batch invariance: 32 prompts of mixed lengths generated together, through the engine core
process, give the greedy tokens of generating each alone in this process (InprocClient), with
prefix caching on and off, under preemption forced by a KV cache too small for the batch, and
over two data-parallel engine cores. So the engine process and DP change nothing but where the
work runs. Comparisons follow the near-tie rule (tiny_model.assert_greedy_match)."""

import os

import pytest
from tiny_model import assert_greedy_match

from minivllm import LLM
from minivllm.entrypoints.llm import MULTIPROCESSING_ENV
from minivllm.sampling_params import SamplingParams

NEAR_TIE = 1e-3  # float32 batch-order noise is ~1e-5 on these logits; a real bug is >> 0.1
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def prompts():
    """32 prompts, 3 to 90 tokens; half share a 40-token prefix, so prefix caching hits."""
    shared = [(7 * i) % 300 + 3 for i in range(40)]
    out = []
    for i in range(32):
        own = [(13 * i + 5 * j) % 300 + 3 for j in range(3 + (i * 11) % 50)]
        out.append(shared + own if i % 2 else own)
    return out


@pytest.fixture(scope="module")
def one_by_one(tiny_dir, prompts):
    """The reference: each prompt alone, in this process, and the logits that chose each token."""
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    with in_process(), LLM(tiny_dir, enable_prefix_caching=False) as llm:
        tokens = [llm.generate([p], greedy, use_tqdm=False)[0].outputs[0].token_ids
                  for p in prompts]
        model = llm.engine_core.engine_core.model_executor.driver_worker.model_runner.model
        logits = [model.score(p + t)[len(p) - 1:-1] for p, t in zip(prompts, tokens)]
    return tokens, logits


@pytest.fixture(scope="module")
def llm(tiny_dir):
    """One engine core process for the small tests below."""
    with LLM(tiny_dir) as llm:
        yield llm


class in_process:
    """MINIVLLM_ENABLE_V1_MULTIPROCESSING=0 inside the block: LLM steps the engine here."""

    def __enter__(self):
        self.old = os.environ.get(MULTIPROCESSING_ENV)
        os.environ[MULTIPROCESSING_ENV] = "0"

    def __exit__(self, *exc):
        if self.old is None:
            del os.environ[MULTIPROCESSING_ENV]
        else:
            os.environ[MULTIPROCESSING_ENV] = self.old


@pytest.mark.parametrize("engine_args", [
    {"enable_prefix_caching": True, "max_num_batched_tokens": 256},
    {"enable_prefix_caching": False, "max_num_batched_tokens": 64},  # more, smaller chunks
    {"enable_prefix_caching": True, "num_kv_blocks": 24, "max_num_batched_tokens": 128},
    {"enable_prefix_caching": True, "max_num_batched_tokens": 256, "data_parallel_size": 2},
], ids=["prefix-caching", "no-prefix-caching", "forced-preemption", "data-parallel-2"])
def test_batch_invariance(tiny_dir, prompts, one_by_one, engine_args):
    reference, ref_logits = one_by_one
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    with LLM(tiny_dir, **engine_args) as llm:
        outs = llm.generate(prompts, greedy, use_tqdm=False)
        per_engine = llm.engine_core.call_utility_all("get_stats")
    for i, out in enumerate(outs):
        assert len(out.outputs[0].token_ids) == MAX_TOKENS
        assert_greedy_match(reference[i], out.outputs[0].token_ids, ref_logits[i], NEAR_TIE,
                            f"prompt {i} ({len(prompts[i])} tokens)")
    if "num_kv_blocks" in engine_args:
        assert per_engine[0]["num_preemptions"] > 0  # the cache really was too small
    if engine_args["enable_prefix_caching"]:
        assert sum(o.num_cached_tokens for o in outs) > 0  # the shared prefix really hit
    assert len(per_engine) == engine_args.get("data_parallel_size", 1)
    assert all(s["kv_blocks_used"] == 0 and s["num_running"] == 0 for s in per_engine)


def test_a_refused_prompt_leaves_nothing_queued(llm):
    """All prompts of a call are validated before any is sent: a bad one in the middle must not
    leave the ones before it running in the engine (they would run into the next call)."""
    greedy = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    with pytest.raises(ValueError, match="shorten it"):
        llm.generate(["The capital", list(range(3, 3000)), "héllo"], greedy, use_tqdm=False)
    assert llm.engine_core.call_utility("get_stats")["num_waiting"] == 0
    assert not llm.output_processor.has_unfinished_requests()
    out = llm.generate(["A paged KV cache"], greedy, use_tqdm=False)
    assert len(out) == 1 and len(out[0].outputs[0].token_ids) == 4


def test_generate_accepts_text_and_keeps_the_order(llm):
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in (5, 2, 9)]
    outs = llm.generate(["The capital", "A paged KV cache", "héllo 🤗"], params, use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outs] == [5, 2, 9]
    assert outs[2].prompt == "héllo 🤗" and outs[0].outputs[0].finish_reason == "length"
    for o in outs:
        assert o.outputs[0].text == llm.tokenizer.decode(o.outputs[0].token_ids)


def test_chat_renders_the_template(llm):
    out = llm.chat([{"role": "user", "content": "hi"}],
                   SamplingParams(temperature=0.0, max_tokens=3), use_tqdm=False)[0]
    assert out.prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert out.prompt_token_ids[0] == llm.tokenizer.backend.token_to_id("<|im_start|>")


def test_stop_string_cuts_the_text_and_frees_the_request(llm):
    greedy = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    full = llm.generate("The capital", greedy, use_tqdm=False)[0].outputs[0].text
    stop = full[4:6]
    assert stop and full.find(stop) == 4
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, stop=[stop])
    out = llm.generate("The capital", params, use_tqdm=False)[0].outputs[0]
    assert out.text == full[:4] and out.finish_reason == "stop" and out.stop_reason == stop
    assert len(out.token_ids) < 20
    stats = llm.engine_core.call_utility("get_stats")
    assert stats["num_running"] == stats["num_waiting"] == stats["kv_blocks_used"] == 0


def test_seeded_sampling_repeats_whatever_the_batch(llm):
    seeded = SamplingParams(temperature=1.0, top_p=0.9, seed=1234, max_tokens=10, ignore_eos=True)
    other = SamplingParams(temperature=1.0, max_tokens=10, ignore_eos=True)
    alone = llm.generate("The capital", seeded, use_tqdm=False)[0].outputs[0].token_ids
    mixed = llm.generate(["héllo", "The capital", "A paged"], [other, seeded, other],
                         use_tqdm=False)[1].outputs[0].token_ids
    assert alone == mixed


def test_paris():
    """The issue's check: SmolLM2-135M-Instruct, greedy, answers with Paris."""
    with LLM() as llm:
        out = llm.chat([{"role": "user", "content": "What is the capital of France?"}],
                       use_tqdm=False)[0]
    assert "Paris" in out.outputs[0].text
