"""`minivllm bench weights`: hand N MB of weights to an engine process by handles vs by pickle.

Three ways, measured side by side in one run against the same engine child, each timed from the
trainer's first action until the engine has copied the weights in place and answered:

- socket+pickle: pickle the state dict, send the bytes over the pipe, unpickle, copy in place;
- shm (warm):   a steady-state round: the trainer's weights already live in shared memory and the
                engine still maps them from the round before; only metadata and file descriptors
                cross the socket, and the engine does one memcpy;
- shm (cold):   a first round: the trainer's weights move into shared memory, the engine maps
                them and takes a page fault per 4 KiB while it copies.

On a GPU machine (`--cuda`) a fourth row does the same through CUDA IPC handles.
Ratio `ipc_speedup_vs_socket` = socket+pickle time / shm (warm) time, at the largest size.
"""

from __future__ import annotations

import statistics
import time

import torch

from minivllm.bench.common import bench_parser, print_table, quick_mode, write_json
from minivllm.demos.weight_engine import (EngineProcess, build_model, checksums,
                                                       model_bytes, shape_for_mib)
from minivllm.utils.progress import tqdm

FULL_SIZES_MIB = (16, 64, 256)  # 256 MiB is the headline: about a 135M-parameter model in fp16
QUICK_SIZES_MIB = (4, 16)
FULL_REPEATS, QUICK_REPEATS = 5, 3
MIB = 1 << 20


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure_size(mib: int, repeats: int, cuda: bool = False) -> list[dict]:
    """Median seconds of each method for a model of about `mib` MiB, plus a correctness check."""
    hidden, n_layers = shape_for_mib(mib)
    trainer = build_model(hidden, n_layers, seed=0)
    nbytes = model_bytes(trainer)
    times: dict[str, list[float]] = {"socket+pickle": [], "shm (warm)": [], "shm (cold)": []}
    with EngineProcess(hidden, n_layers) as engine:
        state = dict(trainer.named_parameters())
        engine.update_ipc(trainer)  # round 1 shares the trainer's memory; the engine maps it
        for _ in range(repeats):  # alternate, so that noise from other programs hits both
            times["socket+pickle"].append(_timed(lambda: engine.update_pickle(state)))
            times["shm (warm)"].append(_timed(lambda: engine.update_ipc(trainer)))
        if engine.checksums() != checksums(trainer):
            raise RuntimeError("the engine's weights differ from the trainer's after the hand-off")
        for _ in range(repeats):  # last: each cold round replaces the engine's cached mappings
            fresh = build_model(hidden, n_layers, seed=0)  # private memory, not yet shared
            times["shm (cold)"].append(_timed(lambda: engine.update_ipc(fresh)))
            del fresh
    if cuda:
        times["cuda ipc"] = _cuda_times(hidden, n_layers, repeats)
    return [{"MiB": round(nbytes / MIB), "method": name, "median_ms": statistics.median(ts) * 1e3,
             "GB/s": nbytes / statistics.median(ts) / 1e9, "runs": len(ts)}
            for name, ts in times.items()]


def _cuda_times(hidden: int, n_layers: int, repeats: int) -> list[float]:
    trainer = build_model(hidden, n_layers, seed=0, device="cuda")
    with EngineProcess(hidden, n_layers, device="cuda") as engine:
        engine.update_ipc(trainer)  # first open of each handle is part of warm-up
        out = [_timed(lambda: engine.update_ipc(trainer)) for _ in range(repeats)]
        if engine.checksums() != checksums(trainer):
            raise RuntimeError("the engine's CUDA weights differ from the trainer's")
    return out


def run(sizes_mib=FULL_SIZES_MIB, repeats: int = FULL_REPEATS, cuda: bool = False) -> tuple[list, dict]:
    rows: list[dict] = []
    for mib in tqdm(sizes_mib, desc="sizes (MiB)", unit="size"):
        rows += measure_size(mib, repeats, cuda)
    top = max(r["MiB"] for r in rows)
    at = {r["method"]: r["median_ms"] for r in rows if r["MiB"] == top}
    ratios = {"ipc_speedup_vs_socket": at["socket+pickle"] / at["shm (warm)"],
              "ipc_cold_speedup_vs_socket": at["socket+pickle"] / at["shm (cold)"]}
    if "cuda ipc" in at:
        ratios["cuda_ipc_speedup_vs_socket"] = at["socket+pickle"] / at["cuda ipc"]
    return rows, ratios


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser("weights", __doc__)
    parser.add_argument("--cuda", action="store_true", help="also measure CUDA IPC (needs a GPU)")
    args = parser.parse_args(argv)
    quick = args.quick or quick_mode()
    if args.cuda and not torch.cuda.is_available():
        parser.error("--cuda needs a CUDA GPU, and torch sees none here")
    rows, ratios = run(QUICK_SIZES_MIB if quick else FULL_SIZES_MIB,
                       QUICK_REPEATS if quick else FULL_REPEATS, args.cuda)
    print_table(rows, ["MiB", "method", "median_ms", "GB/s", "runs"])
    for key, value in ratios.items():
        print(f"{key}: {value:.1f}x")
    write_json(args.json, "weights", rows, ratios)
    return 0
