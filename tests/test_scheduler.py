"""The scheduler's policy, driven step by step. The model is replaced by a fixed answer
(`runner_output`): the scheduler is what is under test, and a sampled token is its input.
A SchedulerConfig loads no model, so these tests need no model directory."""

import numpy as np
import pytest

from minivllm.engine.config import SchedulerConfig
from minivllm.engine.request import Request, RequestStatus
from minivllm.engine.scheduler import Scheduler
from minivllm.engine.scheduler_output import ModelRunnerOutput
from minivllm.sampling_params import SamplingParams

EOS = 2


def make(**kw):
    kw.setdefault("block_size", 4)
    kw.setdefault("num_kv_blocks", 256)
    # as EngineConfig: the model's 1024 positions, capped by the cache
    kw.setdefault("max_model_len", min(1024, kw["num_kv_blocks"] * kw["block_size"]))
    return Scheduler(SchedulerConfig(**kw))


def add(s, rid, n, **params):
    params.setdefault("max_tokens", 100)
    base = 10 + 50 * (ord(rid) - ord("a"))  # distinct prompts: no prefix-cache hits
    r = Request(rid, np.arange(base, base + n, dtype=np.int32), SamplingParams(**params), EOS,
                s.config.block_size)
    s.add_request(r)
    return r


def step(s, token=7):
    so = s.schedule()
    sampled = np.where(so.sample_rows, token, -1).astype(np.int32)
    out = s.update_from_output(so, ModelRunnerOutput(so.req_ids, sampled))
    return so, out


def test_chunked_prefill_splits_a_long_prompt_by_the_token_budget():
    s = make(max_num_batched_tokens=16)
    r = add(s, "a", 40)
    chunks = []
    for _ in range(3):
        so, out = step(s)
        chunks.append(int(so.num_scheduled_tokens[0]))
        assert so.input_token_ids.tolist() == r.all_token_ids[sum(chunks[:-1]):sum(chunks)]
    assert chunks == [16, 16, 8]
    assert len(r.output_token_ids) == 1  # only the last chunk samples
    so, _ = step(s)
    assert so.num_scheduled_tokens.tolist() == [1] and so.num_computed_tokens.tolist() == [40]


def test_new_requests_join_the_running_batch():
    s = make(max_num_batched_tokens=64)
    add(s, "a", 5)
    step(s)
    add(s, "b", 9)
    so, _ = step(s)
    assert so.req_ids == ["a", "b"] and so.num_scheduled_tokens.tolist() == [1, 9]


def test_chunk_fills_what_the_decodes_leave_of_the_budget():
    s = make(max_num_batched_tokens=10)
    add(s, "a", 5)
    add(s, "b", 5)
    step(s)  # a: 5, b: 5
    add(s, "c", 30)
    so, _ = step(s)
    assert so.num_scheduled_tokens.tolist() == [1, 1, 8] and not so.sample_rows[2]


def test_max_num_seqs_caps_the_batch():
    s = make(max_num_seqs=2)
    for rid in "abc":
        add(s, rid, 3)
    so, _ = step(s)
    assert so.req_ids == ["a", "b"]


def test_preemption_frees_blocks_and_recomputes_later():
    s = make(num_kv_blocks=6, enable_prefix_caching=False)  # 24 token slots
    a, b = add(s, "a", 8), add(s, "b", 8)
    seen_preempted = False
    for _ in range(30):
        so, _ = step(s)
        seen_preempted |= b.status == RequestStatus.PREEMPTED
        if seen_preempted and "b" in so.req_ids:
            break
    assert s.num_preemptions >= 1 and seen_preempted
    i = so.req_ids.index("b")  # b resumes: prompt and outputs so far are recomputed
    assert so.num_computed_tokens[i] == 0 and so.sample_rows[i]
    assert so.num_scheduled_tokens[i] == b.num_tokens - 1  # then it sampled one more
    assert a.num_output_tokens > b.num_output_tokens  # the later request was the victim


@pytest.mark.parametrize("params,token,reason", [
    ({}, EOS, "stop"),
    ({"ignore_eos": True, "max_tokens": 3}, EOS, "length"),
    ({"stop_token_ids": [7]}, 7, "stop"),
    ({"max_tokens": 3}, 7, "length"),
])
def test_stop_conditions_finish_and_free(params, token, reason):
    s = make()
    r = add(s, "a", 5, **params)
    for _ in range(5):
        _, out = step(s, token)
        if out.finished_requests:
            break
    assert out.finished_requests == ["a"] and str(out.outputs[0].finish_reason) == reason
    assert r.num_output_tokens == (3 if reason == "length" else 1)
    assert s.kv_cache_manager.num_free_blocks == s.config.num_kv_blocks
    assert not s.has_unfinished_requests()
    if params.get("stop_token_ids"):
        assert out.outputs[0].stop_reason == 7


def test_abort_frees_blocks():
    s = make()
    add(s, "a", 9)
    add(s, "b", 9)
    step(s)
    s.finish_requests(["a", "b"], RequestStatus.FINISHED_ABORTED)
    assert not s.has_unfinished_requests()
    assert s.kv_cache_manager.num_free_blocks == s.config.num_kv_blocks
    assert s.schedule().finished_req_ids == ["a", "b"]


def test_scheduling_does_not_count_tokens_until_the_step_is_made():
    """_make_output only reads the requests; schedule() advances num_computed_tokens once."""
    s = make(max_num_batched_tokens=64)
    r = add(s, "a", 9)
    assert r.num_computed_tokens == 0 and r.num_cached_tokens is None  # not admitted yet
    so = s._make_output([(r, 9)])
    assert r.num_computed_tokens == 0 and so.num_computed_tokens.tolist() == [0]
    so, _ = step(s)
    assert so.num_computed_tokens.tolist() == [0] and r.num_computed_tokens == 9
    assert r.num_cached_tokens == 0  # admitted once, with no prefix-cache hit



def test_a_row_the_worker_failed_ends_its_request_only():
    s = make()
    add(s, "a", 5)
    add(s, "b", 5)
    step(s)
    so = s.schedule()
    sampled = np.where(so.sample_rows, 7, -1).astype(np.int32)
    out = s.update_from_output(so, ModelRunnerOutput(so.req_ids, sampled,
                                                     failed={"a": "sampling settings failed"}))
    by_id = {o.request_id: o for o in out.outputs}
    assert by_id["a"].finish_reason is not None and by_id["a"].error == "sampling settings failed"
    assert by_id["a"].new_token_ids == [] and "a" in out.finished_requests
    assert by_id["b"].new_token_ids == [7] and not by_id["b"].finished
    assert [r.request_id for r in s.running] == ["b"] and "a" not in s.requests
