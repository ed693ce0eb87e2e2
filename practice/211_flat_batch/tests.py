"""The judge's tests for exercise 211. Each receives the learner's module as `impl`."""

from __future__ import annotations

import msgspec
import numpy as np

from minivllm.judge.api import Fail, check_equal, test

BATCH = [("a", [1, 2, 3]), ("b", []), ("c", [70000, 5])]


@test(input=f"batch={BATCH}")
def frame_layout(impl):
    frames = impl.encode(BATCH)
    check_equal(len(frames), 2, "number of frames")
    check_equal(msgspec.msgpack.decode(frames[0]), [["a", "b", "c"], [0, 3, 3, 5]],
                "frame 0 decoded: [request_ids, offsets]")
    check_equal(bytes(frames[1]), np.array([1, 2, 3, 70000, 5], "<i4").tobytes(),
                "frame 1: int32 little-endian token ids")


@test(input="256 requests, every 16th with 512 tokens, the others with 1")
def roundtrip(impl):
    rng = np.random.default_rng(0)
    batch = [(f"r{i}", rng.integers(0, 49152, 512 if i % 16 == 0 else 1).tolist())
             for i in range(256)]
    frames = impl.encode(batch)
    check_equal(memoryview(frames[1]).nbytes, 4 * sum(len(t) for _, t in batch),
                "bytes in frame 1 (4 per token)")
    decoded = impl.decode([bytes(f) for f in frames])
    check_equal(decoded[0], [r for r, _ in batch], "request ids")
    for i, (_, tokens) in enumerate(batch):
        check_equal(impl.tokens_of(decoded, i).tolist(), tokens, f"tokens_of(decoded, {i})")


@test(input="batch=[]  and  batch=[('x', [])]")
def empty(impl):
    for batch in ([], [("x", [])]):
        decoded = impl.decode([bytes(f) for f in impl.encode(batch)])
        check_equal(decoded[0], [r for r, _ in batch], "request ids", str(batch))
        check_equal(len(decoded[1]), 0, "number of tokens", str(batch))


@test(input="decode of frames [body, bytearray of 1000 tokens]")
def zero_copy(impl):
    frames = impl.encode([("a", list(range(1000)))])
    frame1 = bytearray(frames[1])
    ids, tokens, offsets = impl.decode([frames[0], frame1])
    if not isinstance(tokens, np.ndarray) or tokens.dtype != np.int32:
        raise Fail("tokens must be an int32 numpy array", expected="int32 ndarray",
                   got=f"{type(tokens).__name__} {getattr(tokens, 'dtype', '')}")
    if not np.shares_memory(tokens, np.frombuffer(frame1, np.uint8)):
        raise Fail("decode copied the token ids: wrap frame 1 with np.frombuffer instead",
                   expected="a view of frame 1", got="an array with its own memory")
