"""minivllm.flat_batch: a step's batch in one buffer; round trips, views, and malformed buffers
raise DecodeError naming what is wrong."""

import random
import struct

import numpy as np
import pytest
import zmq

from minivllm.bench import serial_batch as sb
from minivllm.flat_batch import HEADER, MAGIC, VERSION, FlatBatch
from minivllm.serial import DecodeError


def _batch(n: int = 32, seed: int = 1) -> tuple[list[dict], FlatBatch]:
    rows = sb.seed_batch(seed=seed, num_requests=n)
    return rows, sb.to_flat_buffer(rows)


@pytest.mark.parametrize("n", [0, 1, 32, 256])
def test_round_trip_carries_every_request(n):
    rows, built = _batch(n)
    got = FlatBatch.decode(bytes(built.encode()))
    assert got.num_reqs == n and sb.same_batch(got, rows)
    assert got.validate() is got
    assert got.token_ids.dtype == np.int32 and got.token_ids.size == sum(
        len(r["token_ids"]) for r in rows)


def test_non_ascii_ids_and_empty_rows():
    ids = ["é-1", "", "请求-3"]
    built = FlatBatch.build(ids, [[1, 2], [], [3]], [[], [7], []])
    got = FlatBatch.decode(bytes(built.encode()))
    assert got.request_ids == ids and got.request_id(2) == "请求-3"
    assert [got.tokens_of(i).tolist() for i in range(3)] == [[1, 2], [], [3]]
    assert [got.blocks_of(i).tolist() for i in range(3)] == [[], [7], []]


def test_decode_views_the_buffer_without_copying():
    _, built = _batch()
    wire = bytes(built.encode())
    got = FlatBatch.decode(wire)
    assert np.shares_memory(got.token_ids, np.frombuffer(wire, np.uint8))
    assert not got.token_ids.flags.writeable  # a view of bytes is read-only


def test_one_frame_over_a_real_socket():
    rows, built = _batch(64)
    ctx = zmq.Context()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    try:
        a.bind("inproc://flat-batch")
        b.connect("inproc://flat-batch")
        a.send(built.encode(), copy=False)
        frame = b.recv(copy=False)
        assert sb.same_batch(FlatBatch.decode(frame.buffer), rows)
    finally:
        a.close(0)
        b.close(0)
        ctx.term()


def test_build_rejects_rows_that_do_not_line_up():
    with pytest.raises(ValueError, match="one of each per request"):
        FlatBatch.build(["a", "b"], [[1]], [[2], [3]])


@pytest.mark.parametrize("cut", [0, 3, HEADER.size - 1])
def test_shorter_than_the_header(cut):
    wire = bytes(_batch()[1].encode())
    with pytest.raises(DecodeError, match="the header alone is 24"):
        FlatBatch.decode(wire[:cut])


def test_truncated_and_trailing_bytes():
    wire = bytes(_batch()[1].encode())
    with pytest.raises(DecodeError, match="truncated"):
        FlatBatch.decode(wire[:-1])
    with pytest.raises(DecodeError, match="trailing bytes"):
        FlatBatch.decode(wire + b"\0")


def test_bad_magic_and_version():
    wire = bytearray(_batch()[1].encode())
    with pytest.raises(DecodeError, match="magic"):
        FlatBatch.decode(b"XXXX" + wire[4:])
    struct.pack_into("<H", wire, 4, VERSION + 1)
    with pytest.raises(DecodeError, match=f"version {VERSION + 1}"):
        FlatBatch.decode(wire)


def test_header_counts_too_large_for_the_buffer():
    # A small message cannot claim a big batch: the counts must add up to the length.
    wire = HEADER.pack(MAGIC, VERSION, 0, 2**31, 2**31, 0, 0)
    with pytest.raises(DecodeError, match="truncated"):
        FlatBatch.decode(wire)


def test_validate_names_the_bad_offsets():
    rows, built = _batch(4)
    wire = bytearray(built.encode())
    struct.pack_into("<i", wire, HEADER.size + 4 * 2, -5)  # token_offsets[2] goes down
    got = FlatBatch.decode(wire)
    with pytest.raises(DecodeError, match="token_offsets"):
        got.validate()


def test_any_buffer_counts_its_bytes():
    # ids of 4 bytes each: the whole message is a whole number of int32s
    built = FlatBatch.build(["abcd", "efgh"], [[1, 2, 3], [4]], [[5], [6, 7]])
    as_int32 = memoryview(np.frombuffer(bytes(built.encode()), np.int32))
    assert len(as_int32) * 4 == len(built.encode())  # len() counts int32s here, not bytes
    got = FlatBatch.decode(as_int32)
    assert got.request_ids == ["abcd", "efgh"] and got.tokens_of(0).tolist() == [1, 2, 3]
    with pytest.raises(DecodeError, match="truncated"):
        FlatBatch.decode(as_int32[:-1])


def test_not_a_buffer():
    with pytest.raises(DecodeError, match="not a FlatBatch"):
        FlatBatch.decode([1, 2, 3])


def test_garbage_raises_only_decode_error():
    rng = random.Random(0)
    wire = bytes(_batch(8)[1].encode())
    for _ in range(300):
        junk = bytearray(wire)
        for _ in range(rng.randint(1, 8)):
            junk[rng.randrange(len(junk))] = rng.randrange(256)
        try:
            got = FlatBatch.decode(bytes(junk[:rng.randint(0, len(junk))]))
            got.validate()
            got.request_ids
        except DecodeError:
            pass
