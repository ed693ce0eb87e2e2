"""The caps on a step's prompt tokens: vLLM's long_prefill_token_threshold (one request's chunk)
and minivllm's target_itl_ms (the step's prompt tokens sized from a fitted step cost). Driven step
by step with a fixed answer for the model, as in test_scheduler.py; the cost model is fed known
costs, never timed, so nothing here depends on the machine's speed."""

import numpy as np
import pytest
from test_llm import MAX_TOKENS, NEAR_TIE, in_process, one_by_one, prompts  # noqa: F401
from test_scheduler import add, make, step
from tiny_model import assert_greedy_match

from minivllm import LLM
from minivllm.engine import scheduler
from minivllm.engine.step_cost import StepCostModel
from minivllm.model.custom_ops import gemm_row_multiple
from minivllm.sampling_params import SamplingParams

FIXED, PER_DECODE, PER_TOKEN = 0.010, 0.001, 0.0005  # seconds: a step's known cost


def known_costs(model: StepCostModel, steps: int = 40) -> None:
    """Steps whose rows cost PER_TOKEN each, padding included (model.row_multiple)."""
    rng = np.random.default_rng(0)
    for _ in range(steps):
        d, p = int(rng.integers(0, 33)), int(rng.integers(0, 2)) * int(rng.integers(1, 513))
        model.observe(d, p, FIXED + PER_DECODE * d + PER_TOKEN * (model.padded(d + p) - d))


def untimed(s, row_multiple: int = 1):
    """The scheduler with its clock off: the cost model holds the known costs only, for a GEMM
    that pads rows to row_multiple (this machine's would make the tests depend on its CPU)."""
    s._time_last_step = lambda: None
    s.step_cost = StepCostModel(row_multiple)
    known_costs(s.step_cost)
    return s


def test_the_fit_recovers_known_costs_and_sizes_the_budget():
    model = StepCostModel()
    model.observe(4, 0, FIXED + 4 * PER_DECODE)
    assert model.prefill_budget(4, 0.05) is None  # too few steps with prompts: no cap yet
    known_costs(model)
    assert model.coef == pytest.approx([FIXED, PER_DECODE, PER_TOKEN], rel=1e-3)
    assert model.predict(8, 100) == pytest.approx(FIXED + 8 * PER_DECODE + 100 * PER_TOKEN)
    # 30 ms - 10 fixed - 4 decodes leave 16 ms: 32 prompt tokens
    assert model.prefill_budget(4, 0.030) == 32
    assert model.prefill_budget(32, 0.030) == 0  # the decodes alone exceed the target


def test_the_budget_fills_the_gemms_padded_rows():
    """A GEMM of 16 rows at a time: 4 decodes and the 32 rows 16 ms pay for make 36 rows, 32
    when whole; 20 decodes leave no whole vector of rows in the target, but 12 padded ones."""
    model = StepCostModel(16)
    known_costs(model)
    assert model.coef == pytest.approx([FIXED, PER_DECODE, PER_TOKEN], rel=1e-3)
    assert model.predict(17, 0) == pytest.approx(model.predict(17, 15))  # one padded vector
    assert model.prefill_budget(4, 0.030) == 28
    assert model.prefill_budget(20, 0.030) == 0
    assert model.free_rows(20) == 12 and model.free_rows(32) == 0


def test_below_the_target_the_prompts_take_the_padding_else_a_block():
    s = untimed(make(max_num_batched_tokens=512, target_itl_ms=5.0, block_size=4), 16)
    for rid in "abc":
        add(s, rid, 3)
    step(s)
    add(s, "d", 40)
    so, _ = step(s)
    assert so.num_scheduled_tokens.tolist() == [1, 1, 1, 13]  # 16 rows: the padding, free


def test_row_multiple_asks_the_gemm_only_under_a_target():
    assert scheduler.row_multiple(make().config) == 1
    assert scheduler.row_multiple(make(target_itl_ms=50.0).config) == gemm_row_multiple()


def test_long_prefill_threshold_caps_each_chunk_only_when_another_request_waits():
    s = make(max_num_batched_tokens=64, long_prefill_token_threshold=16)
    add(s, "a", 40)
    so, _ = step(s)
    assert so.num_scheduled_tokens.tolist() == [40]  # alone: nobody to starve, no cap
    add(s, "b", 40)
    add(s, "c", 40)
    so, _ = step(s)
    assert so.req_ids == ["a", "b", "c"] and so.num_scheduled_tokens.tolist() == [1, 16, 16]


def test_target_itl_caps_the_prompt_tokens_of_a_step_with_decodes():
    s = untimed(make(max_num_batched_tokens=512, target_itl_ms=30.0))
    for rid in "abcd":
        add(s, rid, 5)
    so, _ = step(s)  # no stream decodes yet: the prompts go in whole
    assert so.num_scheduled_tokens.tolist() == [5, 5, 5, 5]
    add(s, "e", 50)
    add(s, "f", 50)
    chunks = []
    while not s.requests["f"].num_computed_tokens == 50:
        so, _ = step(s)
        assert so.num_scheduled_tokens[:4].tolist() == [1, 1, 1, 1]  # decodes never wait
        prompt = sum(n for n in so.num_scheduled_tokens.tolist() if n > 1)
        chunks.append(prompt)
        assert prompt <= 32  # (30 - 10 - 4 x 1) ms / 0.5 ms a token
    assert sum(chunks) == 100 and max(chunks) == 32


def test_target_itl_below_the_decodes_cost_still_moves_a_block_a_step():
    s = untimed(make(max_num_batched_tokens=512, target_itl_ms=5.0, block_size=4))
    add(s, "a", 3)
    step(s)
    add(s, "b", 20)
    so, _ = step(s)
    assert so.num_scheduled_tokens.tolist() == [1, 4]  # one block: prompts always progress


def test_steps_are_timed_from_one_schedule_to_the_next():
    s = make(max_num_batched_tokens=16, target_itl_ms=1000.0)
    add(s, "a", 40, max_tokens=3)
    for _ in range(5):  # three prompt chunks, then two decodes; the request then finishes
        step(s)
    # steps 1-4 were ended by the next schedule(), and 1-3 carried prompt chunks
    assert s.step_cost.prefill_steps == 3
    assert s._step_start is None  # finished: the idle time to come is not a step's
    assert not s.has_unfinished_requests()



def test_capped_prompt_chunks_keep_the_greedy_tokens(tiny_dir, prompts, one_by_one):
    """test_llm's batch invariance with both caps on: 32 prompts together, their chunks cut to
    one block a step once the fit holds (a 1 µs target no step can meet), give the tokens of
    each prompt alone."""
    reference, ref_logits = one_by_one
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    with in_process(), LLM(tiny_dir, target_itl_ms=0.001, long_prefill_token_threshold=24,
                           max_num_batched_tokens=256) as llm:
        outs = llm.generate(prompts, greedy, use_tqdm=False)
        scheduler = llm.engine_core.engine_core.scheduler
    assert scheduler.step_cost.coef is not None  # the target did cap chunks
    for i, out in enumerate(outs):
        assert_greedy_match(reference[i], out.outputs[0].token_ids, ref_logits[i], NEAR_TIE,
                            f"prompt {i} ({len(prompts[i])} tokens)")
