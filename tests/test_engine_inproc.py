"""The in-process EngineCore at its message boundary: EngineCoreRequest in, EngineCoreOutputs
out, the same types a later chapter sends over ZMQ."""

import numpy as np
import pytest
from tiny_model import make_tiny_model_dir

from minivllm.engine.config import EngineConfig
from minivllm.engine.core import EngineCore
from minivllm.engine.messages import EngineCoreOutputs, EngineCoreRequest, FinishReason
from minivllm.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def core(tmp_path_factory):
    core = EngineCore(EngineConfig(model=make_tiny_model_dir(str(tmp_path_factory.mktemp("t")))))
    yield core
    core.shutdown()


def request(rid, n, **params):
    return EngineCoreRequest(rid, np.arange(3, 3 + n, dtype=np.int32), SamplingParams(**params))


def run(core):
    outputs = {}
    while core.has_unfinished_requests():
        step = core.step()
        assert isinstance(step, EngineCoreOutputs)
        for out in step.outputs:
            assert isinstance(out.new_token_ids, list)
            outputs.setdefault(out.request_id, []).append(out)
    return outputs


def test_requests_stream_one_token_per_step_until_finished(core):
    core.add_request(request("a", 10, temperature=0.0, max_tokens=4, ignore_eos=True))
    core.add_request(request("b", 30, temperature=0.0, max_tokens=2, ignore_eos=True))
    outputs = run(core)
    assert [len(outputs["a"]), len(outputs["b"])] == [4, 2]
    assert outputs["a"][-1].finish_reason == FinishReason.LENGTH
    assert all(o.finish_reason is None for o in outputs["a"][:-1])


def test_abort_frees_the_blocks(core):
    core.add_request(request("c", 50, max_tokens=100))
    core.step()
    kv = core.scheduler.kv_cache_manager
    assert kv.num_free_blocks < core.config.num_kv_blocks
    core.abort_requests(["c"])
    assert not core.has_unfinished_requests()
    assert kv.num_free_blocks == core.config.num_kv_blocks
    assert core.step().outputs == []


def test_eos_stops_unless_ignored(core):
    eos = core.config.model_config.eos_token_id
    core.add_request(request("d", 8, temperature=0.0, max_tokens=6, ignore_eos=True))
    first = run(core)["d"][0].new_token_ids[0]
    core.add_request(request("e", 8, temperature=0.0, max_tokens=6, stop_token_ids=[int(first)]))
    out = run(core)["e"]
    assert len(out) == 1 and out[0].finish_reason == FinishReason.STOP
    assert out[0].stop_reason == first and first != eos


def test_bad_requests_are_refused_with_a_reason(core):
    with pytest.raises(ValueError, match="shorten it"):
        core.add_request(request("f", core.config.max_model_len + 1))
    with pytest.raises(ValueError, match="token ids must be in"):
        core.add_request(EngineCoreRequest("g", np.array([10**6], np.int32), SamplingParams()))
