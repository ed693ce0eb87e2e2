"""`minivllm bench serial`: what a step's batch and a large tensor cost on the wire.

1. The seed step batch (256 requests, 8,432 token ids, 2,048 block ids), and its first 32
   requests, encoded and decoded as pickle of dicts, msgpack of dicts, array_like Structs of
   lists, flat arrays through msgpack, and one contiguous buffer (minivllm/flat_batch.py).
   5 rounds, every format once a round; the speedups are the median of the rounds' ratios.
2. A 64 MiB tensor delivered to another process: over ZMQ PUSH/PULL ipc:// out of band
   (minivllm.serial; with and without reuse_large_receive_buffers, and as 1 MiB frames into a
   reused buffer), pickled, and through a ShmTensorArena (written once into shared memory, a
   handle on the wire); against memcpy of the same bytes in one process (prefaulted
   destination) and a raw AF_UNIX stream into a reused buffer (the ceiling of any socket).
   _serial_transfer.py describes each row. Medians, with the spread of each case's deliveries
   and the receiver's page faults per delivery.

The headline ratios are taken within each of 5 rounds and reported as the median of the rounds'
ratios with its spread (KEY_spread: half the range over the median); a spread past 10% is
called out, with what to look at. The two sides of each (the raw socket and zmq out of band;
memcpy and the arena) run together, one delivery of each in turn, and a round's ratio is the
median of its pairs' ratios. What moved oob_tensor_vs_socket_ceiling +-27-50% between runs was
bursts of other programs' CPU time (a delivery sharing its CPU takes 2.5-3x longer, in runs of
several deliveries), which hit all of one case's deliveries and none of the other's when the
cases ran one after the other; page faults (0), huge pages (neither receive buffer has any)
and CPU migrations (rare) did not move it (figures/reference_numbers.md, "Steady ratios").

Ratios (higher is better):
    flat_buffer_vs_pickle_b32     pickle_dicts time / flat_buffer time, 32 requests  (goal >= 50)
    flat_buffer_vs_pickle_b256    the same, 256 requests                             (goal >= 50)
    msgpack_speedup_vs_pickle     pickle_dicts time / flat_arrays time, 256          (goal >= 10)
    oob_tensor_vs_socket_ceiling  raw AF_UNIX time / out-of-band time           (goal >= 0.7)
    shm_tensor_vs_memcpy          memcpy time / shared-memory arena time        (goal >= 0.5)
    oob_fresh_vs_socket_ceiling   raw AF_UNIX time / out of band, glibc's defaults
    oob_tensor_vs_memcpy          memcpy time / out-of-band time
    socket_ceiling_vs_memcpy      memcpy time / raw AF_UNIX time: what any socket can reach
"""

from __future__ import annotations

import os
import statistics

from minivllm.bench import serial_batch as sb
from minivllm.bench import _serial_transfer as st
from minivllm.bench.common import bench_parser, print_table, quick_mode, spread, write_json
from minivllm.utils.progress import tqdm

TENSOR_MIB = 64
QUICK_TENSOR_MIB = 16  # quick mode: a smaller tensor, same comparison
BATCH_REPEATS, QUICK_BATCH_REPEATS = 100, 20  # per format and round
BATCH_ROUNDS, QUICK_BATCH_ROUNDS = 5, 2
BATCH_SIZES = (256, 32)  # 256: the seed batch, rows "batch/..."; others "batchN/..."
# deliveries per round; 9 halved the five-run spread of the socket ratio (reference_numbers.md)
TRANSFER_REPEATS, QUICK_TRANSFER_REPEATS = 9, 3
TRANSFER_ROUNDS, QUICK_TRANSFER_ROUNDS = 5, 1  # every case once per round, in turn
MIB = 1024**2
STEADY_SPREAD = 0.10  # a ratio whose rounds lie within +-10% of their median is steady
# The headline ratios, each taken within every round (the two cases seconds apart) and reported
# as the median over rounds, with the spread: numerator case, denominator case.
ROUND_RATIOS = {"oob_tensor_vs_socket_ceiling": ("socketpair", "zmq_oob"),
                "shm_tensor_vs_memcpy": ("memcpy", "shm_arena")}


def measure_batch(repeats: int, rounds: int) -> tuple[list[dict], dict[str, list[float]]]:
    """One row per batch size and format: bytes, and encode, decode and total µs (medians over
    rounds); and per round, flat_buffer's speedup over pickle at each size."""
    rows, per_round = [], {}
    for n in BATCH_SIZES:
        batch = sb.seed_batch(num_requests=n)
        codecs = sb.codecs(batch)
        for name, (encode, decode) in codecs.items():
            if not sb.same_batch(decode(encode()), batch):
                raise AssertionError(f"{name} did not carry the batch of {n} intact")
        got = [sb.codec_times(codecs, repeats) for _ in range(rounds)]
        per_round[f"flat_buffer_vs_pickle_b{n}"] = [
            sum(r["pickle_dicts"]) / sum(r["flat_buffer"]) for r in got]
        prefix = "batch" if n == sb.NUM_REQUESTS else f"batch{n}"
        for name, (encode, _) in codecs.items():
            enc = statistics.median(r[name][0] for r in got)
            dec = statistics.median(r[name][1] for r in got)
            rows.append({"case": f"{prefix}/{name}", "requests": n,
                         "bytes": sb.wire_bytes(encode()), "encode_us": enc, "decode_us": dec,
                         "total_us": enc + dec, "runs": repeats * rounds})
    return rows, per_round


def measure_tensor(mib: int, repeats: int, rounds: int) -> tuple[list[dict], dict]:
    """One row per way of moving the tensor: median seconds and GB/s over rounds x repeats
    deliveries, and the receiver's median page faults per delivery. The cases take turns round
    by round, and the two sides of each ROUND_RATIOS pair delivery by delivery, so that a burst
    of load from another program hits both, not all the runs of one; the second value holds
    ROUND_RATIOS' per-round values."""
    import torch

    tensor = torch.ones(mib * MIB // 4, dtype=torch.float32)
    nbytes = mib * MIB
    # each headline pair runs together, delivery by delivery in turn (st.paired_times)
    cases = [lambda num=num, den=den: dict(zip(
        (num, den), st.paired_times(_link(num, tensor), _link(den, tensor), repeats)))
        for num, den in ROUND_RATIOS.values()]
    for mode in ("oob_fresh", "oob_into", "pickle"):  # the others alone, one at a time
        cases.append(lambda m=mode: {f"zmq_{m}": st.transfer_times(tensor, m, repeats)})
    times: dict[str, list[float]] = {}
    faults: dict[str, list[int]] = {}
    per_round: dict[str, list[float]] = {key: [] for key in ROUND_RATIOS}
    with tqdm(total=rounds * len(cases), desc=f"{mib} MiB tensor", leave=False) as bar:
        for _ in range(rounds):
            this_round = {}
            for run in cases:
                for name, got in run().items():
                    times.setdefault(name, []).extend(got.seconds)
                    faults.setdefault(name, []).extend(got.faults)
                    this_round[name] = got.seconds
                bar.update()
            for key, (num, den) in ROUND_RATIOS.items():
                per_round[key].append(_round_ratio(this_round[num], this_round[den]))
    rows = []
    for name, got in times.items():
        sec = statistics.median(got)
        rows.append({"case": f"tensor/{name}", "bytes": nbytes, "seconds": sec,
                     "gb_per_s": nbytes / sec / 1e9, "runs": len(got),
                     "faults_per_delivery": statistics.median(faults[name]),
                     "spread": spread(got)})
    return rows, per_round


def _link(case: str, tensor) -> st.Link:
    """The way of delivering that a case names, for st.paired_times."""
    if case == "memcpy":
        return lambda n: st.memcpy_link(tensor.nbytes)
    if case == "socketpair":
        return lambda n: st.socket_link(tensor.nbytes, n)
    return lambda n: st.zmq_link(tensor, "shm" if case == "shm_arena" else "oob", n)


def _round_ratio(num: list[float], den: list[float]) -> float:
    """A round's ratio: the median of its pairs' ratios (the deliveries took turns)."""
    return statistics.median(a / b for a, b in zip(num, den))


def ratios_of(rows: list[dict], per_round: dict[str, list[float]] | None = None
              ) -> dict[str, float]:
    """The ratios of the rows' medians; ROUND_RATIOS' from per_round where given (the median
    of the rounds' ratios, and its spread as KEY_spread)."""
    by = {r["case"]: r for r in rows}

    def sec(case: str) -> float:
        return by[f"tensor/{case}"]["seconds"]
    ratios = {
        "msgpack_speedup_vs_pickle":
            by["batch/pickle_dicts"]["total_us"] / by["batch/flat_arrays"]["total_us"],
        "msgpack_dicts_speedup_vs_pickle":
            by["batch/pickle_dicts"]["total_us"] / by["batch/msgpack_dicts"]["total_us"],
        "oob_tensor_vs_socket_ceiling": sec("socketpair") / sec("zmq_oob"),
        "shm_tensor_vs_memcpy": sec("memcpy") / sec("shm_arena"),
        "oob_fresh_vs_socket_ceiling": sec("socketpair") / sec("zmq_oob_fresh"),
        "oob_into_vs_socket_ceiling": sec("socketpair") / sec("zmq_oob_into"),
        "oob_tensor_vs_memcpy": sec("memcpy") / sec("zmq_oob"),
        "oob_speedup_vs_pickle": sec("zmq_pickle") / sec("zmq_oob"),
        "socket_ceiling_vs_memcpy": sec("memcpy") / sec("socketpair"),
    }
    for key, values in (per_round or {}).items():
        ratios[key] = statistics.median(values)
        ratios[f"{key}_spread"] = spread(values)
    return ratios


def steadiness_note(ratios: dict[str, float], rounds: int) -> str:
    """Where a headline ratio moved between rounds, what to look at on the reader's machine."""
    moved = {k.removesuffix("_spread"): v for k, v in ratios.items() if k.endswith("_spread")}
    loose = {k: v for k, v in moved.items() if v > STEADY_SPREAD}
    if rounds < 2 or not moved:
        return "one round: no spread to report (run without --quick for five)"
    if not loose:
        return f"steady: each headline ratio within +-{STEADY_SPREAD:.0%} over {rounds} rounds"
    named = ", ".join(f"{k} +-{v:.0%}" for k, v in loose.items())
    return (f"NOT steady over {rounds} rounds: {named}. Each round times both sides seconds "
            f"apart (the two sides of each take turns delivery by delivery), so "
            f"what moves one round against another is the machine: other programs (see the "
            f"load average: a 64 MiB delivery that shares its CPU takes 2.5-3x longer), or page "
            f"faults (faults_per_delivery: a receive into fresh memory costs one fault per "
            f"4 KiB page, more than the copy).")


def main(argv: list[str] | None = None) -> int:
    args = bench_parser("serial", __doc__).parse_args(argv)
    quick = args.quick or quick_mode()
    rows, batch_rounds = measure_batch(QUICK_BATCH_REPEATS if quick else BATCH_REPEATS,
                                       QUICK_BATCH_ROUNDS if quick else BATCH_ROUNDS)
    print("the seed step batch and its first 32 requests, encode + decode (medians):")
    print_table(rows, ["case", "requests", "bytes", "encode_us", "decode_us", "total_us", "runs"])
    mib = QUICK_TENSOR_MIB if quick else TENSOR_MIB
    rounds = QUICK_TRANSFER_ROUNDS if quick else TRANSFER_ROUNDS
    tensor_rows, per_round = measure_tensor(
        mib, QUICK_TRANSFER_REPEATS if quick else TRANSFER_REPEATS, rounds)
    print(f"\na {mib} MiB float32 tensor to another process (medians; spread: half the range "
          f"over the median; the receiver's page faults per delivery):")
    print_table(tensor_rows, ["case", "bytes", "seconds", "gb_per_s", "runs", "spread",
                              "faults_per_delivery"])
    rows += tensor_rows
    ratios = ratios_of(rows, {**batch_rounds, **per_round})
    print("\nratios (measured side by side in this run; load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}):")
    for key, value in ratios.items():
        print(f"  {key:34s} {value:6.2f}")
    print(steadiness_note(ratios, rounds))
    write_json(args.json, "serial", rows, ratios)
    return 0
