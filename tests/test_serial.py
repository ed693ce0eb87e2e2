"""minivllm.serial: round trips, zero copy, the pickle opt-in, and garbage in -> DecodeError only."""

import gc
import random

import msgspec
import numpy as np
import pytest
import torch
import zmq

from minivllm.distributed.shm_tensor_arena import ShmTensorArena
from minivllm.engine.messages import EngineCoreOutput, EngineCoreOutputs, EngineCoreRequest
from minivllm.sampling_params import SamplingParams
from minivllm.serial import INSECURE_ENV, DecodeError, MsgpackDecoder, MsgpackEncoder


class Holder(msgspec.Struct, array_like=True):
    name: str
    array: np.ndarray
    tensor: torch.Tensor | None = None


class Opaque:
    """A plain class: msgpack cannot express it, only pickle can."""

    def __init__(self, x):
        self.x = x

    def __eq__(self, other):
        return isinstance(other, Opaque) and other.x == self.x


def roundtrip(obj, t=None, threshold=256):
    return MsgpackDecoder(t).decode(MsgpackEncoder(threshold).encode(obj))


@pytest.mark.parametrize("dtype", ["int32", "int64", "float16", "float32", "float64", "bool",
                                   "uint8", "complex64"])
@pytest.mark.parametrize("shape", [(), (0,), (3,), (2, 5), (64, 33)])
def test_ndarray_roundtrip_every_dtype_and_shape(dtype, shape):
    a = (np.arange(int(np.prod(shape))) % 7).astype(dtype).reshape(shape)
    b = roundtrip(a)
    assert b.dtype == a.dtype and b.shape == a.shape and np.array_equal(a, b)


def test_small_arrays_inline_large_out_of_band():
    enc = MsgpackEncoder(size_threshold=256)
    assert len(enc.encode(np.zeros(63, np.int32))) == 1  # 252 B < 256: inline
    frames = enc.encode([np.zeros(64, np.int32), np.ones(100, np.int8), np.zeros(3)])
    assert len(frames) == 2 and frames[1].nbytes == 256  # only the 256 B array left the body


def test_out_of_band_frame_is_a_view_of_the_senders_array():
    a = np.arange(1000, dtype=np.int32)
    frames = MsgpackEncoder().encode(a)
    assert np.shares_memory(np.frombuffer(frames[1], np.uint8), a)  # encode copied nothing


def test_decoded_array_views_the_frame_memory():
    frames = [bytearray(f) for f in MsgpackEncoder().encode({"x": np.arange(500, dtype=np.int64)})]
    x = MsgpackDecoder().decode(frames)["x"]
    frames[1][0:8] = (123456).to_bytes(8, "little")  # write into the frame: the array sees it
    assert x[0] == 123456


def test_non_contiguous_array_roundtrips():
    a = np.arange(400, dtype=np.float32).reshape(20, 20)[:, ::3]
    assert np.array_equal(roundtrip(a), a)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
@pytest.mark.parametrize("n", [0, 3, 1000])
def test_tensor_roundtrip(dtype, n):
    t = (torch.arange(n) % 5).to(dtype).reshape(-1, 1) if n else torch.empty(0, dtype=dtype)
    u = roundtrip(t)
    assert isinstance(u, torch.Tensor) and u.dtype == t.dtype and torch.equal(u, t)


def test_tensor_requiring_grad_and_non_contiguous():
    t = torch.randn(40, 30, requires_grad=True)
    assert torch.equal(roundtrip(t.t()), t.detach().t())


def test_typed_struct_with_array_and_tensor_fields():
    h = Holder("w", np.arange(300, dtype=np.int16), torch.ones(2, 2))
    out = roundtrip(h, Holder)
    assert out.name == "w" and np.array_equal(out.array, h.array) and torch.equal(out.tensor, h.tensor)


def test_engine_core_request_roundtrip_typed():
    req = EngineCoreRequest("req-7", np.arange(2000, dtype=np.int32),
                            SamplingParams(temperature=0.0, max_tokens=9, stop=["\n"]), 12.5, 1)
    frames = MsgpackEncoder().encode(req)
    assert len(frames) == 2
    out = MsgpackDecoder(EngineCoreRequest).decode(frames)
    assert out.request_id == "req-7" and out.sampling_params == req.sampling_params
    assert out.prompt_token_ids.dtype == np.int32
    assert np.array_equal(out.prompt_token_ids, req.prompt_token_ids)
    assert (out.arrival_time, out.client_index) == (12.5, 1)


def test_engine_core_outputs_roundtrip_through_zmq_frames():
    outs = EngineCoreOutputs(engine_index=1, outputs=[
        EngineCoreOutput(f"r{i}", [i, i + 1]) for i in range(50)],
        finished_requests=["r3"], timestamp=3.0)
    ctx = zmq.Context()
    try:
        a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
        a.bind("inproc://serial-test")
        b.connect("inproc://serial-test")
        a.send_multipart(MsgpackEncoder().encode(outs), copy=False)
        got = MsgpackDecoder(EngineCoreOutputs).decode(b.recv_multipart(copy=False))
        assert got.engine_index == 1 and got.finished_requests == ["r3"]
        assert [o.request_id for o in got.outputs] == [o.request_id for o in outs.outputs]
        assert all(x.new_token_ids == y.new_token_ids for x, y in zip(got.outputs, outs.outputs))
        a.close(linger=0)
        b.close(linger=0)
    finally:
        ctx.term()


def test_pickle_refused_by_default_with_a_message_naming_the_opt_in(monkeypatch):
    monkeypatch.delenv(INSECURE_ENV, raising=False)
    with pytest.raises(TypeError, match=INSECURE_ENV):
        MsgpackEncoder().encode({"x": Opaque(1)})
    with pytest.raises(TypeError, match=INSECURE_ENV):
        MsgpackEncoder().encode(np.array([object()], dtype=object))


def test_pickle_allowed_when_opted_in_and_refused_by_a_decoder_that_did_not(monkeypatch):
    monkeypatch.setenv(INSECURE_ENV, "1")
    frames = MsgpackEncoder().encode({"x": Opaque(2)})
    assert MsgpackDecoder().decode(frames) == {"x": Opaque(2)}
    monkeypatch.delenv(INSECURE_ENV)
    with pytest.raises(DecodeError, match=INSECURE_ENV):
        MsgpackDecoder().decode(frames)


def test_type_mismatch_is_a_decode_error():
    frames = MsgpackEncoder().encode(Holder("x", np.zeros(3)))
    with pytest.raises(DecodeError):
        MsgpackDecoder(EngineCoreRequest).decode(frames)
    with pytest.raises(DecodeError):
        MsgpackDecoder(Holder).decode(MsgpackEncoder().encode(["x", 5]))


def test_missing_or_extra_frames():
    frames = MsgpackEncoder().encode(np.zeros(1000))
    with pytest.raises(DecodeError, match="frame 1"):
        MsgpackDecoder().decode(frames[:1])
    with pytest.raises(DecodeError):
        MsgpackDecoder().decode([])
    with pytest.raises(DecodeError):  # the frame is there but too short for the shape
        MsgpackDecoder().decode([frames[0], b"\x00" * 10])


def _valid_messages():
    return [MsgpackEncoder().encode(x) for x in (
        EngineCoreRequest("r", np.arange(100, dtype=np.int32), SamplingParams()),
        {"a": np.arange(10, dtype=np.float32), "t": torch.arange(100)},
        EngineCoreOutputs(outputs=[EngineCoreOutput("a", np.array([1], np.int32))]),
    )]


def _decode_only_decode_error(decoder, frames):
    try:
        decoder.decode(frames)
    except DecodeError:
        pass  # the documented error; anything else propagates and fails the test


@pytest.mark.parametrize("t", [None, EngineCoreRequest, EngineCoreOutputs])
def test_fuzz_random_bytes_raise_only_decode_error(t):
    rng = random.Random(1234)
    decoder = MsgpackDecoder(t)
    for _ in range(10_000):
        _decode_only_decode_error(decoder, [rng.randbytes(rng.randrange(0, 64))])


def test_fuzz_mutated_valid_messages_and_random_frame_lists():
    rng = random.Random(99)
    valid = _valid_messages()
    decoders = [MsgpackDecoder(), MsgpackDecoder(EngineCoreRequest)]
    for _ in range(10_000):
        frames = [bytearray(f) for f in rng.choice(valid)]
        body = frames[0]
        for _ in range(rng.randrange(1, 4)):  # flip bytes where the structure lives
            body[rng.randrange(len(body))] = rng.randrange(256)
        if rng.random() < 0.3:
            frames = frames[: rng.randrange(len(frames) + 1)]
        if rng.random() < 0.2:
            frames.append(rng.randbytes(rng.randrange(50)))
        if rng.random() < 0.05:
            frames.append(rng.choice([None, 3, "text", object()]))
        _decode_only_decode_error(rng.choice(decoders), frames)


def test_encoder_is_reusable_and_frames_do_not_leak_between_calls():
    enc = MsgpackEncoder()
    assert len(enc.encode(np.zeros(1000))) == 2
    assert len(enc.encode({"small": 1})) == 1


# --- hostile input: wrong argument types, amplification, token ids of the wrong kind ---------
@pytest.mark.parametrize("frames", [None, 5, 2.5, iter([b"\x90"]), object()])
def test_anything_but_frames_is_a_decode_error(frames):
    with pytest.raises(DecodeError, match="frames"):
        MsgpackDecoder().decode(frames)


def _oob_array_message(shape, dtype="<i4", index=1):
    """A body holding one out-of-band array ext value, with a header that says `shape`."""
    header = msgspec.msgpack.encode((dtype, shape, index))
    return msgspec.msgpack.encode(msgspec.msgpack.Ext(2, header))


@pytest.mark.parametrize("code", [1, 2])
def test_a_header_with_millions_of_dimensions_is_refused_before_it_is_built(code):
    """The header of a 7.6 MiB message claimed 2M dimensions of 0 (an empty array): the decoder
    built the 2M-tuple and then the array before any check. The header is now bounded first."""
    shape = (0,) * 2_000_000
    if code == 2:
        body = _oob_array_message(shape)
    else:  # inline: the u16 header length caps it, so the limit on dimensions must hold
        header = msgspec.msgpack.encode(("<i4", (0,) * 100))
        body = msgspec.msgpack.encode(msgspec.msgpack.Ext(
            1, len(header).to_bytes(2, "little") + header))
    with pytest.raises(DecodeError, match="dimensions|header"):
        MsgpackDecoder().decode([body, b""])


def test_typed_request_accepts_native_int32_token_ids():
    request = EngineCoreRequest("r", np.arange(300, dtype=np.int32), SamplingParams())
    got = roundtrip(request, EngineCoreRequest)
    assert got.prompt_token_ids.dtype == np.int32 and got.prompt_token_ids.tolist() == list(range(300))


@pytest.mark.parametrize("ids", [
    np.arange(4, dtype=np.float64),
    np.arange(4, dtype=np.int32).reshape(2, 2),
    np.arange(4, dtype=">i4"),
    np.ones(4, dtype=bool),
    np.array(7, dtype=np.int32),
    np.arange(300, dtype=np.int64),  # out of band too
], ids=["float64", "2-D", "big-endian", "bool", "0-d", "int64"])
def test_typed_request_rejects_token_ids_of_the_wrong_kind(ids):
    frames = MsgpackEncoder().encode(EngineCoreRequest("r", ids, SamplingParams()))
    with pytest.raises(DecodeError, match="int32"):
        MsgpackDecoder(EngineCoreRequest).decode(frames)


# --- large arrays through a shared-memory arena -----------------------------------------------
def test_arena_carries_large_arrays_by_handle_and_releases_the_slot_when_freed():
    with ShmTensorArena(slot_bytes=1 << 20, max_slots=2, min_bytes=4096) as sender:
        reader = ShmTensorArena.attach(sender.handle())
        enc, dec = MsgpackEncoder(arena=sender), MsgpackDecoder(arena=reader)
        big, small = np.arange(100_000, dtype=np.int32), np.arange(50, dtype=np.int32)
        frames = enc.encode({"big": big, "t": torch.ones(2048), "small": small})
        assert len(frames) == 1, "arrays past min_bytes travel as handles, not frames"
        got = dec.decode(frames)
        assert np.array_equal(got["big"], big) and torch.equal(got["t"], torch.ones(2048))
        assert not got["big"].flags.writeable
        assert sender.put(memoryview(big).cast("B")) is None, "both slots are still in use"
        view = got["big"][10:20]
        del got
        gc.collect()
        assert sender.put(memoryview(big).cast("B")) == 1, "slot 0 is held by a view"
        del view
        gc.collect()
        with pytest.raises(DecodeError, match="holds nothing"):  # a stale handle
            dec.decode(frames)
        forged = msgspec.msgpack.encode(msgspec.msgpack.Ext(6, msgspec.msgpack.encode(
            ("<i4", (4,), 7, 16))))
        with pytest.raises(DecodeError, match="outside the arena"):
            dec.decode(forged)
        with pytest.raises(DecodeError, match="no arena"):
            MsgpackDecoder().decode(frames)
        reader.close()
