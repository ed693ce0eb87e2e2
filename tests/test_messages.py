"""The wire types: one-byte request types, compact array_like encoding, typed round trips."""

import msgspec
import numpy as np
import pytest

from minivllm.engine.messages import (
    ENGINE_CORE_DEAD, TOKEN_DTYPE, EngineCoreOutput, EngineCoreOutputs, EngineCoreReadyResponse, EngineCoreRequest,
    EngineCoreRequestType, FinishReason, UtilityOutput, UtilityRequest)
from minivllm.sampling_params import SamplingParams
from minivllm.serial import DecodeError, MsgpackDecoder, MsgpackEncoder


def test_request_types_are_distinct_single_bytes_and_parse_back():
    values = [t.value for t in EngineCoreRequestType]
    assert all(isinstance(v, bytes) and len(v) == 1 for v in values)
    assert len(set(values)) == len(values)
    for t in EngineCoreRequestType:
        assert EngineCoreRequestType(bytes(bytearray(t.value))) is t  # as read from a frame
    with pytest.raises(ValueError):
        EngineCoreRequestType(b"\x7f")


def test_request_types_match_vllm_values():
    assert {t.name: t.value for t in EngineCoreRequestType} == {
        "ADD": b"\x00", "ABORT": b"\x01", "START_DP_WAVE": b"\x02", "UTILITY": b"\x03",
        "EXECUTOR_FAILED": b"\x04", "WAKEUP": b"\x05"}


def test_array_like_omits_names_and_defaults():
    body = msgspec.msgpack.encode(EngineCoreOutputs())
    assert body[0] == 0x95 and len(body) == 14  # 5 values, no field names
    body = MsgpackEncoder().encode(EngineCoreOutput("abc", [1]))[0]
    assert b"request_id" not in body and len(body) < 40


def test_request_roundtrip_keeps_token_dtype_and_sampling_params():
    req = EngineCoreRequest("r", np.arange(5000, dtype=TOKEN_DTYPE),
                            SamplingParams(temperature=0.7, top_k=40, seed=3, stop=["END"]))
    frames = MsgpackEncoder().encode(req)
    assert len(frames) == 2 and frames[1].nbytes == 5000 * 4  # tokens out of band, raw
    got = MsgpackDecoder(EngineCoreRequest).decode(frames)
    assert got.prompt_token_ids.dtype == TOKEN_DTYPE
    assert np.array_equal(got.prompt_token_ids, req.prompt_token_ids)
    assert got.sampling_params == req.sampling_params


def test_outputs_roundtrip_with_finish_reason_and_utility():
    outs = EngineCoreOutputs(
        engine_index=2,
        outputs=[EngineCoreOutput("a", [7, 8], FinishReason.LENGTH,
                                  num_cached_tokens=16),
                 EngineCoreOutput("b", [9], FinishReason.STOP, "\n")],
        finished_requests=["a", "b"], utility_output=UtilityOutput(4, result=[1, "x"]),
        timestamp=1.25)
    got = MsgpackDecoder(EngineCoreOutputs).decode(MsgpackEncoder().encode(outs))
    assert got.outputs[0].finish_reason is FinishReason.LENGTH and got.outputs[0].finished
    assert got.outputs[1].stop_reason == "\n" and str(got.outputs[1].finish_reason) == "stop"
    assert got.outputs[0].new_token_ids == [7, 8]  # a list: tiny payloads decode fastest so
    assert got.utility_output == UtilityOutput(4, result=[1, "x"])
    assert (got.engine_index, got.finished_requests, got.timestamp) == (2, ["a", "b"], 1.25)


def test_utility_request_and_ready_response_roundtrip():
    u = UtilityRequest(5, "reset_prefix_cache", [1, "a"], client_index=1)
    assert MsgpackDecoder(UtilityRequest).decode(MsgpackEncoder().encode(u)) == u
    r = EngineCoreReadyResponse(0, num_gpu_blocks=128, block_size=16, max_model_len=2048)
    assert MsgpackDecoder(EngineCoreReadyResponse).decode(MsgpackEncoder().encode(r)) == r


def test_invalid_sampling_params_on_the_wire_is_a_decode_error():
    body = msgspec.msgpack.encode(["r", None, [-1.0]])  # negative temperature
    with pytest.raises(DecodeError):
        MsgpackDecoder(EngineCoreRequest).decode([body])


def test_engine_core_dead_frame_is_never_a_valid_outputs_body():
    with pytest.raises(DecodeError):
        MsgpackDecoder(EngineCoreOutputs).decode([ENGINE_CORE_DEAD])
    body = MsgpackEncoder().encode(EngineCoreOutputs())[0]
    assert body[:1] != ENGINE_CORE_DEAD[:1]
