"""The judge's tests for exercise 211. Each receives the learner's module as `impl`."""

from __future__ import annotations

import re
import tracemalloc

import msgspec
import numpy as np

from minivllm.judge.api import Fail, check_equal, step, test
from minivllm.judge.properties import for_all, st

BATCH = [("a", [1, 2, 3]), ("b", []), ("c", [70000, 5])]
INT32_MIN, INT32_MAX = -2**31, 2**31 - 1
PROPERTY_EXAMPLES = 300  # batches hypothesis draws per property: the same ones on every run
# 1-6 requests of 0-8 token ids anywhere in int32 (hypothesis favours the two ends, 0 and -1),
# request ids empty, repeated or not ASCII. The empty batch has a test of its own (`empty`).
BATCHES = st.lists(st.tuples(st.text(max_size=6), st.lists(st.integers(INT32_MIN, INT32_MAX),
                                                               max_size=8)), min_size=1, max_size=6)


def ref_frames(batch) -> list[bytes]:
    """The judge's own writer of the README's format, independent of the learner's."""
    offsets = [0]
    for _, tokens in batch:
        offsets.append(offsets[-1] + len(tokens))
    body = msgspec.msgpack.encode([[rid for rid, _ in batch], offsets])
    return [body, b"".join(t.to_bytes(4, "little", signed=True) for _, ts in batch for t in ts)]


@test(input=f"batch={BATCH}, then {PROPERTY_EXAMPLES} batches drawn by hypothesis whose token "
      "ids span int32, compared byte for byte with the judge's own writer")
def frame_layout(impl):
    step(f"encode({BATCH})")
    frames = impl.encode(BATCH)
    check_equal(len(frames), 2, "number of frames (frame 0: msgpack [request_ids, offsets]; "
                "frame 1: the token ids)")
    check_equal(msgspec.msgpack.decode(frames[0]), [["a", "b", "c"], [0, 3, 3, 5]],
                "frame 0 decoded: [request_ids, offsets]")
    check_equal(bytes(frames[1]), np.array([1, 2, 3, 70000, 5], "<i4").tobytes(),
                "frame 1: int32 little-endian token ids")
    step(f"encode of {PROPERTY_EXAMPLES} batches drawn by hypothesis")
    for_all(BATCHES, lambda batch: _encodes_as_the_judge(impl, batch), examples=PROPERTY_EXAMPLES,
            what="batch")


def _encodes_as_the_judge(impl, batch) -> None:
    want = ref_frames(batch)
    try:
        got = [bytes(f) for f in impl.encode(batch)]
    except Exception as e:
        raise Fail(f"encode raised {type(e).__name__}: {e}; every token id here fits int32, "
                   "so the README requires it to encode") from None
    check_equal(msgspec.msgpack.decode(got[0]), msgspec.msgpack.decode(want[0]),
                "frame 0 decoded: [request_ids, offsets]")
    if got[1] != want[1]:
        raise Fail("frame 1 is not every token id as little-endian int32, in order",
                   expected=want[1], got=got[1])


@test(input="token ids 2**31-1 and -2**31 (the int32 ends), then 2**31, -2**31-1 and 2**40")
def int32_range(impl):
    edge = [("e", [INT32_MAX, INT32_MIN, 0])]
    step(f"encode({edge})")
    got = bytes(impl.encode(edge)[1])
    check_equal(got, ref_frames(edge)[1], "frame 1 for the two ends of int32", str(edge))
    for bad in (2**31, INT32_MIN - 1, 2**40):
        batch = [("ok", [1, 2]), ("bad", [7, bad])]
        step(f"encode({batch})")
        try:
            frames = impl.encode(batch)
        except (OverflowError, ValueError):
            continue
        sent = np.frombuffer(bytes(frames[1]), "<i4").tolist()
        raise Fail(f"token id {bad} does not fit int32: the README requires encode to raise "
                   "OverflowError or ValueError, not to send another number",
                   expected="OverflowError or ValueError", got=f"frame 1 holds {sent}",
                   input=f"batch={batch}")


@test(input="256 requests, every 16th with 512 tokens, the others with 1, decoded from bytes, "
      "from the frames as encode returned them, and with frame 1 a memoryview of int32 items; "
      f"then the judge's frames of {PROPERTY_EXAMPLES} batches drawn by hypothesis, decoded by your "
      "decode")
def roundtrip(impl):
    rng = np.random.default_rng(0)
    batch = [(f"r{i}", rng.integers(0, 49152, 512 if i % 16 == 0 else 1).tolist())
             for i in range(256)]
    step("encode(256 requests, every 16th with 512 tokens)")
    frames = impl.encode(batch)
    check_equal(memoryview(frames[1]).nbytes, 4 * sum(len(t) for _, t in batch),
                "bytes in frame 1 (4 per token)")
    body, data = ref_frames(batch)
    for how, given in (("bytes", [bytes(f) for f in frames]), ("as encode returned them", frames),
                       ("frame 1 a memoryview of int32 items",
                        [body, memoryview(np.frombuffer(data, "<i4"))])):
        step(f"decode(frames given {how}), then tokens_of(decoded, i) of every request")
        try:
            decoded = impl.decode(given)
        except ValueError as e:
            raise Fail(f"decode of frames given {how} raised ValueError: size frame 1 by its "
                       "bytes (memoryview(f).nbytes), not len(), which counts a memoryview's items",
                       got=str(e)) from None
        check_equal(decoded[0], [r for r, _ in batch], "request ids", f"frames given {how}")
        for i, (_, tokens) in enumerate(batch):
            check_equal(impl.tokens_of(decoded, i).tolist(), tokens, f"tokens_of(decoded, {i})",
                        f"frames given {how}")
    step(f"decode and tokens_of of the judge's frames of {PROPERTY_EXAMPLES} batches")
    for_all(BATCHES, lambda batch: _decodes_the_judges_frames(impl, batch),
            examples=PROPERTY_EXAMPLES, what="batch")


def _decodes_the_judges_frames(impl, batch) -> None:
    frames = ref_frames(batch)
    decoded = impl.decode(frames)
    check_equal(list(decoded[0]), [r for r, _ in batch], "request ids of the judge's frames")
    check_equal(list(decoded[2]), msgspec.msgpack.decode(frames[0])[1],
                "offsets of the judge's frames")
    for i, (_, tokens) in enumerate(batch):
        check_equal(impl.tokens_of(decoded, i).tolist(), tokens,
                    f"tokens_of(decoded, {i}) of the judge's frames")


@test(input="batch=[]  and  batch=[('x', [])]")
def empty(impl):
    for batch in ([], [("x", [])]):
        step(f"decode(encode({batch}))")
        decoded = impl.decode([bytes(f) for f in impl.encode(batch)])
        check_equal(decoded[0], [r for r, _ in batch], "request ids", str(batch))
        check_equal(len(decoded[1]), 0, "number of tokens (a batch with no tokens decodes to an empty "
                    "int32 array)", str(batch))


@test(input="decode of frames [body, bytearray of 1000 tokens], then of that bytearray as a "
      "memoryview (bytes, then int32 items), then tokens_of(decoded, 1) of a batch of three")
def zero_copy(impl):
    step("encode([('a', 1000 tokens)]), then decode([body, bytearray(frame 1)])")
    frames = impl.encode([("a", list(range(1000)))])
    frame1 = bytearray(frames[1])
    ids, tokens, offsets = impl.decode([frames[0], frame1])
    if not isinstance(tokens, np.ndarray) or tokens.dtype != np.int32:
        raise Fail("tokens must be an int32 numpy array", expected="int32 ndarray",
                   got=f"{type(tokens).__name__} {getattr(tokens, 'dtype', '')}")
    if not np.shares_memory(tokens, np.frombuffer(frame1, np.uint8)):
        raise Fail("decode copied the token ids: wrap frame 1 with np.frombuffer instead",
                   expected="a view of frame 1", got="an array with its own memory")
    for how, view in (("a memoryview", memoryview(frame1)),
                      ("a memoryview of int32 items", memoryview(np.frombuffer(frame1, "<i4")))):
        step(f"decode([body, frame 1 as {how}])")
        if not np.shares_memory(impl.decode([frames[0], view])[1], np.frombuffer(frame1, np.uint8)):
            raise Fail(f"decode copied the token ids of a frame 1 given as {how} (as zmq's "
                       "recv(copy=False) gives it): np.frombuffer takes any buffer without a copy",
                       expected="a view of frame 1", got="an array with its own memory")
    frames = ref_frames([("a", [1]), ("b", [2, 3, 4]), ("c", [5])])
    frame1 = bytearray(frames[1])
    step("decode of a batch of three, then tokens_of(decoded, 1)")
    decoded = impl.decode([frames[0], frame1])
    part = impl.tokens_of(decoded, 1)
    if not isinstance(part, np.ndarray) or not np.shares_memory(part, np.frombuffer(frame1, np.uint8)):
        raise Fail("tokens_of copied request 1's tokens: the README requires a slice of tokens "
                   "(tokens[offsets[i]:offsets[i+1]]), a view of frame 1",
                   expected="a view of frame 1", got=f"{type(part).__name__} with its own memory")


@test(input="frame 1 with one token more, then one token fewer, than offsets[-1]; then offsets "
      "one short of len(request_ids) + 1, one too many, and none at all for no request ids "
      "(every size a multiple of 4); then what the ValueError says of 16 bytes for 3 tokens "
      "and of 5 offsets for 12 request ids")
def decode_checks_sizes(impl):
    batch = [("a", [1, 2]), ("b", [3])]
    body, data = ref_frames(batch)
    short_offsets = msgspec.msgpack.encode([["a", "b"], [0, 3]])
    cases = [("frame 1 with 4 tokens for offsets[-1] == 3", [body, data + bytes(4)]),
             ("frame 1 with 2 tokens for offsets[-1] == 3", [body, data[:-4]]),
             ("offsets [0, 3] for request ids ['a', 'b']", [short_offsets, data]),
             ("offsets [0, 2, 3, 3] for request ids ['a', 'b']",
              [msgspec.msgpack.encode([["a", "b"], [0, 2, 3, 3]]), data]),
             ("offsets [] for request ids [] (and an empty frame 1)",
              [msgspec.msgpack.encode([[], []]), b""])]
    for what, frames in cases:
        step(f"decode of {what}")
        try:
            impl.decode(frames)
        except ValueError:
            continue
        except Exception as e:
            raise Fail(f"decode of {what} raised {type(e).__name__}; the README requires "
                       "ValueError", expected="ValueError", got=repr(e)) from None
        raise Fail(f"decode accepted {what}: the README requires ValueError when frame 1 is "
                   "not exactly 4 * offsets[-1] bytes or offsets is not len(request_ids) + 1 "
                   "long", expected="ValueError", got="no error", input=what)
    many = [str(i) for i in range(12)]
    for what, frames, numbers in [
            ("frame 1 of 16 bytes for offsets[-1] == 3 (12 bytes)", [body, data + bytes(4)],
             {"frame 1's bytes": "16", "offsets[-1]": "3", "4 * offsets[-1]": "12"}),
            ("5 offsets for 12 request ids", [msgspec.msgpack.encode([many, [0, 1, 2, 3, 4]]),
                                              bytes(16)],
             {"the number of offsets": "5", "the number of request ids": "12"})]:
        step(f"decode of {what}")
        try:
            impl.decode(frames)
            message = "(no error)"
        except ValueError as e:
            message = str(e)
        named = re.findall(r"-?\d+(?:\.\d+)?", message)
        missing = [f"{what_n} ({n})" for what_n, n in numbers.items() if n not in named]
        if missing:
            raise Fail(f"decode's ValueError for {what} does not name {', '.join(missing)}: the "
                       "README requires the message to give the sizes that disagree, so that "
                       "the reader of a log knows which frame is wrong", expected=
                       f"a message naming {', '.join(numbers.values())}", got=repr(message),
                       input=what)


@test(input="encode of 300 tokens, its frames kept as encode returned them; then encode of 100 "
      "tokens and of 500 tokens; the first frames read again after each")
def encoded_frames_stand_alone(impl):
    first = [("a", list(range(300)))]
    step("encode(300 tokens 0..299)")
    frames, want = impl.encode(first), ref_frames(first)
    for later in ([("b", list(range(-100, 0)))], [("c", list(range(10**6, 10**6 + 500)))]):
        step(f"encode({later[0][0]!r}: {len(later[0][1])} tokens), then the first frames read again")
        impl.encode(later)
        got = [bytes(f) for f in frames]
        if got != want:
            changed = "frame 1 (the token ids)" if got[0] == want[0] else "frame 0"
            raise Fail(f"the frames of one encode changed when the next encode ran ({changed}): "
                       "each encode must return buffers of its own. A staging buffer reused by "
                       "every encode is overwritten by the next batch while the caller may still "
                       "hold or send the frames of this one (zmq's send(copy=False) sends later)",
                       expected="the first batch's frames unchanged",
                       got=f"frame 1 starts {got[1][:16].hex()}",
                       input=f"encode(300 tokens 0..299), then encode({later[0][0]!r}: "
                             f"{len(later[0][1])} tokens)")


SIZE_TOKENS = 1 << 20  # a 4 MiB frame 1: any copy of it dwarfs what decode itself needs


@test(input="decode of a 4 MiB frame 1 given as bytes, a bytearray, a memoryview and a memoryview "
      "of int32 items, with tracemalloc counting every byte decode allocates")
def decode_allocates_no_copy(impl):
    body = msgspec.msgpack.encode([["a"], [0, SIZE_TOKENS]])
    data = bytearray(np.arange(SIZE_TOKENS, dtype="<i4").tobytes())
    for how, frame1 in (("bytes", bytes(data)), ("a bytearray", data),
                        ("a memoryview", memoryview(data)),
                        ("a memoryview of int32 items", memoryview(np.frombuffer(data, "<i4")))):
        tracemalloc.start()
        try:
            impl.decode([body, frame1])
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        if peak >= len(data) // 4:
            raise Fail(f"decode allocated {peak:,} bytes for a frame 1 of {len(data):,} bytes given "
                       f"as {how}: it copied the frame on the way, even if the array it returns is "
                       "a view. Size frame 1 with memoryview(frame).nbytes (not len(bytes(frame)) "
                       "or .tobytes()) and wrap it with np.frombuffer",
                       expected=f"well under {len(data) // 4:,} bytes", got=f"{peak:,} bytes")
