"""The seed's step batch in five wire formats, for `minivllm bench serial` and chapter 04.

The batch: 256 requests. Every 16th is a prefill chunk of 512 prompt tokens; the others are
decodes of one token (after a 16-token prompt). Each request carries a block table of 8 ids.
That is 8,432 token ids and 2,048 block ids; figures/reference_numbers.md has reference timings.

    format         what crosses the wire
    pickle_dicts   pickle of [{"request_id", "token_ids": [int], "block_ids": [int]}, ...]
    msgpack_dicts  the same dicts as msgpack (msgspec)
    struct_lists   list[RequestRow]: array_like Structs, ids as lists of ints
    flat_arrays    one StepBatch: all ids in two int32 arrays plus offsets, through
                   minivllm.serial (msgpack body, the arrays out of band)
    flat_buffer    one FlatBatch (minivllm/flat_batch.py): the same arrays and the request ids
                   in one contiguous buffer behind a fixed header, built once; encode hands
                   the buffer out, decode checks the header and views the rest

Smaller batches (`seed_batch(num_requests=32)`) keep the pattern: request i is a prefill chunk
when i % 16 == 0.
"""

from __future__ import annotations

import pickle
import statistics
import time
from collections.abc import Callable
from typing import Any

import msgspec
import numpy as np

from minivllm.flat_batch import FlatBatch
from minivllm.serial import MsgpackDecoder, MsgpackEncoder

NUM_REQUESTS = 256
PREFILL_EVERY = 16  # every 16th request is a prefill chunk
PREFILL_TOKENS = 512
DECODE_TOKENS = 1
BLOCKS_PER_REQUEST = 8
VOCAB = 49152  # SmolLM2's vocabulary


class RequestRow(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """One request of the batch, the object-per-request way."""

    request_id: str
    token_ids: list[int]
    block_ids: list[int]
    num_computed_tokens: int = 0


class StepBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """The whole batch, the flat way: request i owns token_ids[token_offsets[i]:token_offsets[i+1]]."""

    request_ids: list[str]
    token_ids: np.ndarray  # int32, all requests' scheduled tokens, concatenated
    token_offsets: np.ndarray  # int32, NUM_REQUESTS + 1
    block_ids: np.ndarray  # int32, all block tables, concatenated
    block_offsets: np.ndarray  # int32, NUM_REQUESTS + 1

    def tokens_of(self, i: int) -> np.ndarray:
        return self.token_ids[self.token_offsets[i]:self.token_offsets[i + 1]]


def seed_batch(seed: int = 0, num_requests: int = NUM_REQUESTS) -> list[dict[str, Any]]:
    """The batch as plain dicts of lists: what a Python program holds before any care."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(num_requests):
        n = PREFILL_TOKENS if i % PREFILL_EVERY == 0 else DECODE_TOKENS
        rows.append({"request_id": f"req-{i}",
                     "token_ids": rng.integers(0, VOCAB, n).tolist(),
                     "block_ids": rng.integers(0, 4096, BLOCKS_PER_REQUEST).tolist()})
    return rows


def to_rows(batch: list[dict]) -> list[RequestRow]:
    return [RequestRow(r["request_id"], r["token_ids"], r["block_ids"]) for r in batch]


def to_flat(batch: list[dict]) -> StepBatch:
    def flat(key: str) -> tuple[np.ndarray, np.ndarray]:
        lists = [r[key] for r in batch]
        offsets = np.zeros(len(lists) + 1, np.int32)
        np.cumsum([len(x) for x in lists], out=offsets[1:])
        return np.concatenate([np.asarray(x, np.int32) for x in lists]), offsets

    tokens, token_offsets = flat("token_ids")
    blocks, block_offsets = flat("block_ids")
    return StepBatch([r["request_id"] for r in batch], tokens, token_offsets, blocks, block_offsets)


def to_flat_buffer(batch: list[dict]) -> FlatBatch:
    return FlatBatch.build([r["request_id"] for r in batch], [r["token_ids"] for r in batch],
                           [r["block_ids"] for r in batch])


Codec = tuple[Callable[[], Any], Callable[[Any], Any]]  # encode() -> wire, decode(wire) -> obj


def codecs(batch: list[dict]) -> dict[str, Codec]:
    """For each format: encode the batch, and decode what encode produced."""
    rows, flat = to_rows(batch), to_flat(batch)
    row_enc, row_dec = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder(list[RequestRow])
    dict_enc, dict_dec = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder()
    flat_enc, flat_dec = MsgpackEncoder(), MsgpackDecoder(StepBatch)
    flat_buffer = to_flat_buffer(batch)
    return {
        "pickle_dicts": (lambda: pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL),
                         pickle.loads),
        "msgpack_dicts": (lambda: dict_enc.encode(batch), dict_dec.decode),
        "struct_lists": (lambda: row_enc.encode(rows), row_dec.decode),
        "flat_arrays": (lambda: flat_enc.encode(flat), flat_dec.decode),
        "flat_buffer": (flat_buffer.encode, FlatBatch.decode),
    }


def codec_times(codecs: dict[str, Codec], repeats: int) -> dict[str, tuple[float, float]]:
    """Each format's median encode and decode µs over `repeats`, the formats one after another
    (a round: call it several times and compare ratios within each)."""
    out = {}
    for name, (encode, decode) in codecs.items():
        enc, dec = [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            wire = encode()
            t1 = time.perf_counter()
            decode(wire)
            enc.append(t1 - t0)
            dec.append(time.perf_counter() - t1)
        out[name] = (statistics.median(enc) * 1e6, statistics.median(dec) * 1e6)
    return out


def wire_bytes(wire: Any) -> int:
    """Bytes on the wire: one buffer, or the sum of a frame list."""
    if isinstance(wire, list):
        return sum(memoryview(f).nbytes for f in wire)
    return len(wire)


def same_batch(decoded: Any, batch: list[dict]) -> bool:
    """Did the format carry the batch intact? (each decoder returns its own shape)"""
    if isinstance(decoded, FlatBatch):
        return (decoded.request_ids == [r["request_id"] for r in batch]
                and all(decoded.blocks_of(i).tolist() == r["block_ids"] for i, r in enumerate(batch))
                and all(decoded.tokens_of(i).tolist() == r["token_ids"] for i, r in enumerate(batch)))
    if isinstance(decoded, StepBatch):
        return all(decoded.tokens_of(i).tolist() == r["token_ids"] for i, r in enumerate(batch))
    if decoded and isinstance(decoded[0], RequestRow):
        return [r.token_ids for r in decoded] == [r["token_ids"] for r in batch]
    return decoded == batch
