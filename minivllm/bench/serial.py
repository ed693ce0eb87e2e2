"""`minivllm bench serial`: what a step's batch and a large tensor cost on the wire.

1. The seed step batch (256 requests, 8,432 token ids, 2,048 block ids) encoded and decoded as
   pickle of dicts, msgpack of dicts, array_like Structs of lists, and minivllm's flat arrays.
2. A 64 MiB tensor delivered to another process over ZMQ PUSH/PULL ipc://: out of band
   (minivllm.serial) vs pickled, against memcpy of the same bytes in one process (prefaulted
   destination, medians), a raw AF_UNIX stream (the ceiling of any socket), and out of band
   as 1 MiB frames received into a reused buffer (no page faults).

Ratios (higher is better):
    msgpack_speedup_vs_pickle  pickle_dicts time / flat_arrays time   (goal >= 10)
    oob_tensor_vs_memcpy       memcpy time / out-of-band delivery time (goal >= 0.5)
    socket_ceiling_vs_memcpy   memcpy time / raw AF_UNIX delivery time: what any socket can reach
    oob_into_vs_memcpy         memcpy time / 1 MiB frames received into a reused buffer
"""

from __future__ import annotations

import statistics
import time

from tqdm import tqdm

from minivllm.bench import serial_batch as sb
from minivllm.bench import serial_transfer as st
from minivllm.bench.common import bench_parser, print_table, quick_mode, write_json

TENSOR_MIB = 64
QUICK_TENSOR_MIB = 16  # quick mode: a smaller tensor, same comparison
BATCH_REPEATS, QUICK_BATCH_REPEATS = 200, 30
TRANSFER_REPEATS, QUICK_TRANSFER_REPEATS = 9, 3
MIB = 1024**2


def measure_batch(repeats: int) -> list[dict]:
    """One row per format: bytes, and median encode, decode and total µs."""
    batch = sb.seed_batch()
    rows = []
    for name, (encode, decode) in sb.codecs(batch).items():
        wire = encode()
        if not sb.same_batch(decode(wire), batch):
            raise AssertionError(f"{name} did not carry the batch intact")
        enc_t, dec_t = [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            wire = encode()
            t1 = time.perf_counter()
            decode(wire)
            enc_t.append(t1 - t0)
            dec_t.append(time.perf_counter() - t1)
        enc, dec = statistics.median(enc_t) * 1e6, statistics.median(dec_t) * 1e6
        rows.append({"case": f"batch/{name}", "bytes": sb.wire_bytes(wire),
                     "encode_us": enc, "decode_us": dec, "total_us": enc + dec,
                     "runs": repeats})
    return rows


def measure_tensor(mib: int, repeats: int) -> list[dict]:
    """One row per way of moving the tensor: median seconds and GB/s."""
    import torch

    tensor = torch.ones(mib * MIB // 4, dtype=torch.float32)
    nbytes = mib * MIB
    rows = []
    cases = [("memcpy", lambda: st.memcpy_times(nbytes, repeats)),
             ("socketpair", lambda: st.socketpair_times(nbytes, repeats)),
             ("zmq_oob", lambda: st.transfer_times(tensor, "oob", repeats)),
             ("zmq_oob_into", lambda: st.transfer_times(tensor, "oob_into", repeats)),
             ("zmq_pickle", lambda: st.transfer_times(tensor, "pickle", repeats))]
    for name, run in tqdm(cases, desc=f"{mib} MiB tensor", leave=False):
        sec = statistics.median(run())
        rows.append({"case": f"tensor/{name}", "bytes": nbytes, "seconds": sec,
                     "gb_per_s": nbytes / sec / 1e9, "runs": repeats})
    return rows


def ratios_of(rows: list[dict]) -> dict[str, float]:
    by = {r["case"]: r for r in rows}
    return {
        "msgpack_speedup_vs_pickle":
            by["batch/pickle_dicts"]["total_us"] / by["batch/flat_arrays"]["total_us"],
        "msgpack_dicts_speedup_vs_pickle":
            by["batch/pickle_dicts"]["total_us"] / by["batch/msgpack_dicts"]["total_us"],
        "oob_tensor_vs_memcpy": by["tensor/memcpy"]["seconds"] / by["tensor/zmq_oob"]["seconds"],
        "oob_speedup_vs_pickle":
            by["tensor/zmq_pickle"]["seconds"] / by["tensor/zmq_oob"]["seconds"],
        "socket_ceiling_vs_memcpy":
            by["tensor/memcpy"]["seconds"] / by["tensor/socketpair"]["seconds"],
        "oob_tensor_vs_socket_ceiling":
            by["tensor/socketpair"]["seconds"] / by["tensor/zmq_oob"]["seconds"],
        "oob_into_vs_memcpy":
            by["tensor/memcpy"]["seconds"] / by["tensor/zmq_oob_into"]["seconds"],
    }


def main(argv: list[str] | None = None) -> int:
    args = bench_parser("serial", __doc__.splitlines()[0]).parse_args(argv)
    quick = args.quick or quick_mode()
    rows = measure_batch(QUICK_BATCH_REPEATS if quick else BATCH_REPEATS)
    print("the seed step batch, encode + decode (medians):")
    print_table(rows, ["case", "bytes", "encode_us", "decode_us", "total_us", "runs"])
    mib = QUICK_TENSOR_MIB if quick else TENSOR_MIB
    tensor_rows = measure_tensor(mib, QUICK_TRANSFER_REPEATS if quick else TRANSFER_REPEATS)
    print(f"\na {mib} MiB float32 tensor to another process over ZMQ ipc:// (medians):")
    print_table(tensor_rows, ["case", "bytes", "seconds", "gb_per_s", "runs"])
    rows += tensor_rows
    ratios = ratios_of(rows)
    print("\nratios (measured side by side in this run):")
    for key, value in ratios.items():
        print(f"  {key:34s} {value:6.2f}")
    write_json(args.json, "serial", rows, ratios)
    return 0
