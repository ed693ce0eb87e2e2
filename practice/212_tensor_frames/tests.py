"""The judge's tests for exercise 212. Each receives the learner's module as `impl`."""

from __future__ import annotations

import random

import msgspec
import numpy as np
import zmq

from minivllm.judge.api import Fail, check_equal, test

GARBAGE_CASES = 3000  # random byte strings fed to the decoder, after the crafted ones


def _ext_of(frame0) -> msgspec.msgpack.Ext:
    ext = msgspec.msgpack.decode(bytes(frame0))  # no ext_hook: ext values come back as Ext
    if not isinstance(ext, msgspec.msgpack.Ext):
        raise Fail("frame 0 must be a single msgpack ext value for a bare array",
                   expected="msgspec.msgpack.Ext", got=type(ext).__name__)
    return ext


def _same(got, want, what: str, where: str) -> None:
    if not isinstance(got, np.ndarray):
        raise Fail(f"{what}: decode must return a numpy array", expected="ndarray",
                   got=type(got).__name__, input=where)
    check_equal((got.dtype.str, got.shape), (want.dtype.str, want.shape), f"{what}: (dtype, shape)",
                where)
    if not np.array_equal(got, want, equal_nan=want.dtype.kind in "fc"):
        raise Fail(f"{what}: values differ", expected=want.tolist(), got=got.tolist(), input=where)


@test(input="encode(np.array([1, 2, 3], dtype='<i4'))  (12 bytes, below the threshold)")
def inline_wire_format(impl):
    arr = np.array([1, 2, 3], dtype="<i4")
    frames = impl.TensorEncoder().encode(arr)
    check_equal(len(frames), 1, "number of frames (a small array goes inline)")
    ext = _ext_of(frames[0])
    head = msgspec.msgpack.encode(["<i4", [3]])
    check_equal(ext.code, impl.EXT_INLINE, "ext code")
    check_equal(bytes(ext.data), len(head).to_bytes(2, "little") + head + arr.tobytes(),
                "inline payload: u16 LE header length | header ['<i4', [3]] | raw bytes")


@test(input="encode(np.arange(1000, dtype='<f8').reshape(10, 100))  (8,000 bytes)")
def out_of_band_wire_format(impl):
    arr = np.arange(1000, dtype="<f8").reshape(10, 100)
    frames = impl.TensorEncoder().encode(arr)
    check_equal(len(frames), 2, "number of frames (body + one out-of-band buffer)")
    ext = _ext_of(frames[0])
    check_equal(ext.code, impl.EXT_OOB, "ext code")
    check_equal(msgspec.msgpack.decode(bytes(ext.data)), ["<f8", [10, 100], 1],
                "out-of-band payload [dtype, shape, frame index]")
    check_equal(memoryview(frames[1]).nbytes, arr.nbytes, "bytes in frame 1")
    check_equal(bytes(frames[1]), arr.tobytes(), "frame 1: the array's raw bytes in C order")
    if not np.shares_memory(np.frombuffer(frames[1], np.uint8), arr):
        raise Fail("encode copied a contiguous array: frame 1 must view the array's memory",
                   expected="a view (np.shares_memory is True)", got="a copy")
    two = impl.TensorEncoder().encode({"a": arr, "b": [np.ones(64, "<i8"), np.zeros(2, "u1")]})
    check_equal(len(two), 3, "frames for {'a': 8000 B, 'b': [512 B, 2 B]}")


@test(input="threshold=256: arrays of 255, 256 and 257 bytes (uint8); threshold=64: 63 and 64")
def threshold_boundary(impl):
    for threshold, n, want in [(256, 255, 1), (256, 256, 2), (256, 257, 2), (64, 63, 1),
                               (64, 64, 2)]:
        frames = impl.TensorEncoder(threshold).encode(np.zeros(n, np.uint8))
        check_equal(len(frames), want, f"frames for {n} bytes (inline below the threshold, "
                    "out of band at or above it)", f"threshold={threshold}, {n} bytes")


def _samples() -> list[tuple[str, np.ndarray]]:
    rng = np.random.default_rng(212)
    out = [("0-d float64", np.array(3.5)), ("0-d int8", np.array(-7, np.int8)),
           ("empty (0,)", np.zeros(0, np.float32)), ("empty (3, 0)", np.zeros((3, 0), np.int16)),
           ("empty (0, 500)", np.zeros((0, 500), np.float64)),
           ("big-endian >i4", np.arange(-5, 100, dtype=">i4")),
           ("bool", rng.random(300) < 0.5)]
    for dt in ["u1", "i2", "u2", "<i4", "<i8", "<u8", "<f2", "<f4", "<f8", "<c8", "<c16"]:
        for shape in [(5,), (2, 3, 4), (64, 33)]:
            vals = (rng.standard_normal(shape) * 1000).astype(dt) if dt[-2] in "fc" else \
                rng.integers(0, 200, shape).astype(dt)
            out.append((f"{dt} {shape}", vals))
    out.append(("float nan and inf", np.array([np.nan, np.inf, -np.inf, -0.0] * 100)))
    return out


@test(input="dtypes u1..c16, bool, >i4; shapes 0-d, empty, 1-3 dims; inside a dict and a list")
def roundtrip_many(impl):
    samples = _samples()
    enc, dec = impl.TensorEncoder(), impl.TensorDecoder()
    for name, arr in samples:
        frames = enc.encode(arr)
        _same(dec.decode([bytes(f) for f in frames]), arr, "round trip", f"{name} array")
    msg = {"ids": [a for _, a in samples[:12]], "step": 7, "name": "batch"}
    got = dec.decode([bytes(f) for f in enc.encode(msg)])
    check_equal((got["step"], got["name"]), (7, "batch"), "the non-array fields", "a dict")
    for i, (name, arr) in enumerate(samples[:12]):
        _same(got["ids"][i], arr, f"ids[{i}]", f"{{'ids': [...], 'step': 7}} holding {name}")


@test(input="a transpose, a slice with a step, a reversed view, a Fortran-order array")
def non_contiguous(impl):
    base = np.arange(24 * 40, dtype="<i4").reshape(24, 40)
    cases = [("base.T", base.T), ("base[::3, 1::2]", base[::3, 1::2]),
             ("base[::-1]", base[::-1]), ("np.asfortranarray(base)", np.asfortranarray(base)),
             ("base[:2, ::7] (small: inline)", base[:2, ::7])]
    enc, dec = impl.TensorEncoder(), impl.TensorDecoder()
    for name, arr in cases:
        _same(dec.decode([bytes(f) for f in enc.encode(arr)]), arr, "round trip", name)


@test(input="decode([body, bytearray(frame 1)]) of a 40,000-byte float32 array, nested")
def zero_copy_decode(impl):
    arr = np.linspace(0, 1, 10_000, dtype="<f4")
    frames = impl.TensorEncoder().encode({"x": [arr]})
    frame1 = bytearray(frames[1])
    got = impl.TensorDecoder().decode([bytes(frames[0]), frame1])["x"][0]
    _same(got, arr, "round trip", "a bytearray frame")
    if not np.shares_memory(got, np.frombuffer(frame1, np.uint8)):
        raise Fail("decode copied the out-of-band frame: wrap it with np.frombuffer instead",
                   expected="a view of frame 1", got="an array with its own memory")


@test(input="a 1 MiB array sent over a zmq PAIR (inproc://), recv_multipart(copy=False)")
def zero_copy_through_zmq(impl):
    arr = np.arange(256 * 1024, dtype="<i4")
    ctx = zmq.Context()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    try:
        a.bind("inproc://t212")
        b.connect("inproc://t212")
        a.send_multipart(impl.TensorEncoder().encode(arr), copy=False)
        frames = b.recv_multipart(copy=False)
        check_equal(len(frames), 2, "frames received")
        got = impl.TensorDecoder().decode(frames)
        _same(got, arr, "round trip", "through zmq")
        if not np.shares_memory(got, np.frombuffer(frames[1].buffer, np.uint8)):
            raise Fail("the decoded array does not view the zmq frame's memory",
                       expected="a view of frames[1].buffer", got="a copy")
    finally:
        a.close(0)
        b.close(0)
        ctx.term()


def _crafted(impl) -> list[tuple[str, list]]:
    enc = msgspec.msgpack.encode
    head = enc(["<i4", [3]])
    inline = len(head).to_bytes(2, "little") + head + bytes(12)
    big = impl.TensorEncoder().encode(np.zeros(100, "<i8"))
    return [
        ("no frames", []),
        ("empty frame 0", [b""]),
        ("unknown ext code 9", [enc(msgspec.msgpack.Ext(9, b"xyz"))]),
        ("inline, 11 of 12 bytes", [enc(msgspec.msgpack.Ext(impl.EXT_INLINE, inline[:-1]))]),
        ("inline, header length past the end", [enc(msgspec.msgpack.Ext(impl.EXT_INLINE,
                                                                        b"\xff\x00" + head))]),
        ("object dtype '|O8'", [enc(msgspec.msgpack.Ext(
            impl.EXT_OOB, enc(["|O8", [1], 1]))), bytes(8)]),
        ("out of band, frame 1 missing", [bytes(big[0])]),
        ("out of band, frame index 5 of 2", [enc(msgspec.msgpack.Ext(
            impl.EXT_OOB, enc(["<i8", [100], 5]))), bytes(800)]),
        ("out of band, frame index 0 (the body)", [enc(msgspec.msgpack.Ext(
            impl.EXT_OOB, enc(["<i8", [0], 0])))]),
        ("out of band, 799 bytes for 100 x <i8", [bytes(big[0]), bytes(799)]),
        ("negative shape", [enc(msgspec.msgpack.Ext(impl.EXT_OOB, enc(["<i8", [-100], 1]))),
                            bytes(800)]),
        ("dtype 'banana'", [enc(msgspec.msgpack.Ext(impl.EXT_OOB, enc(["banana", [1], 1]))),
                            bytes(8)]),
        ("header is a string", [enc(msgspec.msgpack.Ext(impl.EXT_OOB, enc("x"))), bytes(8)]),
    ]


@test(input="crafted bad messages, then 3,000 random byte strings (seed 212)", timeout=20,
      hang="decode loops on garbage instead of raising DecodeError")
def garbage_raises_decode_error(impl):
    dec = impl.TensorDecoder()
    rng = random.Random(212)
    body = bytes(impl.TensorEncoder().encode({"a": np.arange(9, dtype="<i2")})[0])
    cases = _crafted(impl)
    for i in range(GARBAGE_CASES):
        n = rng.randrange(0, 64)
        if i % 2:  # a valid body with some bytes flipped, which reaches the ext hook
            b = bytearray(body)
            for _ in range(rng.randrange(1, 4)):
                b[rng.randrange(len(b))] = rng.randrange(256)
            cases.append((f"corrupted body {bytes(b)!r}", [bytes(b), bytes(n)]))
        else:
            cases.append((f"random {n} bytes", [rng.randbytes(n)]))
    for name, frames in cases:
        try:
            dec.decode(frames)
        except impl.DecodeError:
            continue
        except Exception as e:
            raise Fail("decode must raise DecodeError (and only DecodeError) on a bad message",
                       expected="DecodeError", got=f"{type(e).__name__}: {e}", input=name)
        else:
            if name.startswith(("random", "corrupted")):
                continue  # some random bytes are a valid message by chance
            raise Fail("decode accepted a bad message", expected="DecodeError",
                       got="no error", input=name)
