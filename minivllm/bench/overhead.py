"""minivllm bench overhead: what the engine core's own process costs a decode step.

The same batches (1, 8, 32 sequences of decode) are stepped in this process (InprocClient) and
through an engine core process (SyncMPClient), in one run, round after round, so that each
ratio compares two numbers measured side by side. Both engines are alive at once; the idle one
blocks on its input queue and takes no CPU. Then the wire: one step's EngineCoreOutputs at each
batch, encoded and decoded, with tokens as per-output arrays (the first design), one flat array
for the step, and small lists (what minivllm sends).

Headline: multiproc_vs_inproc_b32 (tok/s through the process / tok/s in process; goal >= 0.95).
"""

from __future__ import annotations

import statistics
import time

import msgspec
import numpy as np

from minivllm.bench.common import (bench_parser, median_time, print_table, quick_mode,
                                   write_json)
from minivllm.bench.executor import executor_rows
from minivllm.bench.load import LoadMeter
from minivllm.engine.config import EngineConfig
from minivllm.engine.core_client import InprocClient
from minivllm.engine.core_client_mp import SyncMPClient
from minivllm.engine.messages import EngineCoreOutput, EngineCoreOutputs, EngineCoreRequest
from minivllm.sampling_params import SamplingParams
from minivllm.serial import MsgpackDecoder, MsgpackEncoder
from minivllm.utils.progress import tqdm

BATCHES = (1, 8, 32)
PROMPT_LEN = 16  # tokens; short, so the run is decode
WARMUP_STEPS = 3  # after the prefill step: caches warm, every request decoding


# --- decode through a client --------------------------------------------------------------
def decode_rate(client, batch: int, steps: int, tag: str) -> tuple[float, float]:
    """(tokens per second, ms per step) of `steps` decode steps of `batch` sequences."""
    ids = [f"{tag}-{i}" for i in range(batch)]
    params = SamplingParams(temperature=0.0, max_tokens=WARMUP_STEPS + steps + 8, ignore_eos=True)
    vocab = client.config.model_config.vocab_size
    for i, rid in enumerate(ids):
        prompt = (np.arange(PROMPT_LEN, dtype=np.int32) * 7 + 13 * i) % (vocab - 3) + 3
        client.add_request(EngineCoreRequest(rid, prompt, params))
    mine = set(ids)

    def next_step() -> int:  # outputs of aborted requests of an earlier run are skipped
        while True:
            n = sum(o.request_id in mine for o in client.get_output().outputs)
            if n:
                return n
    for _ in range(1 + WARMUP_STEPS):
        next_step()
    tokens, start = 0, time.perf_counter()
    for _ in range(steps):
        tokens += next_step()
    elapsed = time.perf_counter() - start
    client.abort_requests(ids)
    return tokens / elapsed, elapsed / steps * 1e3


# --- the wire: three ways to send a step's new tokens ------------------------------------------
class ArrayOutput(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    request_id: str
    new_token_ids: np.ndarray
    finish_reason: int | None = None
    stop_reason: int | str | None = None
    num_cached_tokens: int = 0


class ArrayOutputs(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    engine_index: int = 0
    outputs: list[ArrayOutput] = []
    timestamp: float = 0.0


class FlatOutput(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    request_id: str
    finish_reason: int | None = None
    stop_reason: int | str | None = None
    num_cached_tokens: int = 0


class FlatOutputs(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    engine_index: int = 0
    outputs: list[FlatOutput] = []
    new_token_ids: np.ndarray | None = None  # every output's tokens, one after another
    num_new_tokens: np.ndarray | None = None  # how many belong to each output
    timestamp: float = 0.0


def _layouts(batch: int) -> dict[str, tuple[object, type, object]]:
    """name -> (one step's message, its type, a function that hands out each output's tokens)."""
    ids = [f"chatcmpl-{i:08d}" for i in range(batch)]
    toks = list(range(1000, 1000 + batch))

    def per_array(m):
        return [o.new_token_ids.tolist() for o in m.outputs]

    def per_list(m):
        return [o.new_token_ids for o in m.outputs]

    def per_flat(m):
        flat, counts = m.new_token_ids.tolist(), m.num_new_tokens.tolist()
        ends = np.cumsum(counts).tolist()
        return [flat[e - c:e] for c, e in zip(counts, ends)]
    return {
        "array per output": (ArrayOutputs(0, [ArrayOutput(r, np.array([t], np.int32))
                                              for r, t in zip(ids, toks)], 1.0),
                             ArrayOutputs, per_array),
        "flat array per step": (FlatOutputs(0, [FlatOutput(r) for r in ids],
                                            np.array(toks, np.int32), np.ones(batch, np.int32),
                                            1.0), FlatOutputs, per_flat),
        "lists (minivllm)": (EngineCoreOutputs(0, [EngineCoreOutput(r, [t])
                                                   for r, t in zip(ids, toks)], timestamp=1.0),
                             EngineCoreOutputs, per_list),
    }


def wire_rows(batch: int, repeats: int) -> list[dict]:
    """Encode and decode (and hand out the tokens) of one step's outputs, in microseconds."""
    rows, encoder = [], MsgpackEncoder()
    for name, (msg, typ, hand_out) in _layouts(batch).items():
        decoder, frames = MsgpackDecoder(typ), encoder.encode(msg)
        n = 200
        enc = median_time(lambda: [encoder.encode(msg) for _ in range(n)], repeats) / n
        dec = median_time(lambda: [hand_out(decoder.decode(frames)) for _ in range(n)],
                          repeats) / n
        rows.append({"kind": "wire", "batch": batch, "layout": name,
                     "bytes": sum(len(f) for f in frames), "encode_us": enc * 1e6,
                     "decode_us": dec * 1e6})
    return rows


# --- the run ----------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = bench_parser("overhead", __doc__)
    parser.add_argument("--model", help="a .gguf file or HF directory (default SmolLM2-135M)")
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)))
    args = parser.parse_args(argv)
    quick = args.quick or quick_mode()
    steps, rounds = (6, 1) if quick else (32, 3)
    batches = [int(b) for b in args.batches.split(",")]
    config = EngineConfig(model=args.model, max_num_batched_tokens=max(batches) * PROMPT_LEN)
    mp_client = SyncMPClient(config)  # first: this process has not run torch yet, fork is safe
    inproc = InprocClient(config)
    samples: dict[int, list[tuple[float, float, float, float]]] = {b: [] for b in batches}
    bar = tqdm(total=rounds * len(batches), desc="overhead", unit="batch")
    try:
        with LoadMeter() as load:  # counts the engine core too: it is this process's child
            for r in range(rounds):
                for batch in batches:
                    mp_first = (r + batch) % 2 == 0  # alternate who runs first
                    runs = [(mp_client, "mp"), (inproc, "in")]
                    res = {}
                    for client, tag in (runs if mp_first else runs[::-1]):
                        res[tag] = decode_rate(client, batch, steps, f"{tag}{r}b{batch}")
                    samples[batch].append((*res["in"], *res["mp"]))
                    bar.update(1)
    finally:
        bar.close()
        mp_client.shutdown()
        inproc.shutdown()
    results, ratios = [], {}
    for batch in batches:
        s = samples[batch]
        row = {"kind": "decode", "batch": batch,
               "inproc_tok_s": statistics.median(x[0] for x in s),
               "multiproc_tok_s": statistics.median(x[2] for x in s),
               "inproc_step_ms": statistics.median(x[1] for x in s),
               "multiproc_step_ms": statistics.median(x[3] for x in s),
               "multiproc_vs_inproc": statistics.median(x[2] / x[0] for x in s), "rounds": len(s)}
        results.append(row)
        ratios[f"multiproc_vs_inproc_b{batch}"] = round(row["multiproc_vs_inproc"], 3)
    print_table(results, ["batch", "inproc_tok_s", "multiproc_tok_s", "inproc_step_ms",
                          "multiproc_step_ms", "multiproc_vs_inproc", "rounds"])
    print(f"each ratio: the median over {rounds} round(s) of two rates measured side by side, "
          f"{steps} decode steps each")
    print(load.describe(what="the ratios"))
    wire = [row for batch in batches for row in wire_rows(batch, 3 if quick else 7)]
    print_table(wire, ["batch", "layout", "bytes", "encode_us", "decode_us"])
    by = {(w["batch"], w["layout"]): w["encode_us"] + w["decode_us"] for w in wire}
    top = max(batches)
    ratios[f"wire_array_vs_lists_b{top}"] = round(by[(top, "array per output")]
                                                  / by[(top, "lists (minivllm)")], 2)
    ratios[f"wire_flat_vs_lists_b{top}"] = round(by[(top, "flat array per step")]
                                                 / by[(top, "lists (minivllm)")], 2)
    ratios["load_others_cores"] = round(load.others_cores() or 0, 2)
    wire += executor_rows(config, top, steps, rounds, ratios)  # bench/executor.py
    print("ratios:", ratios)
    write_json(args.json, "overhead", results + wire, ratios,
               machine={"loadavg_1min": round(load.load_before, 2)})
    return 0
