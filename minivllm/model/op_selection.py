"""Which model ops run in C on this CPU: each op timed against its torch version, the faster kept.

A kernel tuned on one CPU can lose to torch on another (figures/reference_numbers.md: an
AVX-512-shaped kernel on an AVX2-only EPYC), so each op is measured before the model trusts it,
and the model sets op_choice.py's table from the result once, at load (prepare). Each op is
timed at a few rows (batch 1-7 decode) and at many (32) on SmolLM2's shapes, through each op's
explicit C and torch entry points (custom_ops.py), interleaved so that a neighbour's burst hits
both (paired_timing.py), and the faster kept. q_linear is also timed at a prompt chunk's rows
(PREFILL_ROWS): its C GEMM against the blocks dequantized for torch's sgemm ("mm"). The
choice is cached next to the built library, one file per thread count, so later processes read
it instead of timing again (unless it was timed on an oversubscribed machine that has since
become quieter).

MINIVLLM_CUSTOM_OPS picks the policy: "auto" (the default: measured), "c" (every op in C where
it builds) or "torch" (no C at all). MINIVLLM_Q_LINEAR_PREFILL sets q_linear's prefill way
where the C ops are built: "auto" (the default: measured), "c", "mm", or "bf16" (opt-in, not
the float32 numbers: custom_ops.q_linear_mm). `python -m minivllm.model.op_selection` builds,
measures again and prints the table; `minivllm bench throughput` prints it too.

    cache file cpu_ops-<build key>.t<threads>.json:
    {"threads": 2, "load_average": 1.2,
     "ops": {"skinny_linear/few": {"choice": "c", "c_speedup": 1.12, "c_us": 610.0,
                                   "torch_us": 700.0},
             "paged_decode/many": {...}, ...}}
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable

import torch
from gguf import GGMLQuantizationType

from minivllm.model import cpu_features, csrc_build, custom_ops, op_choice
from minivllm.model.attention import AttentionMetadata, decode_torch
from minivllm.model.greedy_head import build_screen, screen_tokens
from minivllm.model.linear import matmul, split_rows
from minivllm.model.op_choice import OPS, PREFILL_ROWS
from minivllm.model.paired_timing import paired_ratio
from minivllm.model.quant_linear import QuantWeight, repack

BUDGET_S = 0.05  # per op: rounds stop past this; quiet, every op takes a few ms
# SmolLM2-135M's shapes (the default model); the choice is made once for the CPU, not per model
HIDDEN, INTER, VOCAB = 576, 1536, 49152
HEADS, KV_HEADS, HEAD_DIM, BLOCK, CONTEXT = 9, 3, 64, 16, 256  # CONTEXT: tokens per sequence
LAYER_MATRICES = [((HEADS + 2 * KV_HEADS) * HEAD_DIM, HIDDEN), (HIDDEN, HEADS * HEAD_DIM),
                  (2 * INTER, HIDDEN), (HIDDEN, INTER)]  # qkv, o, gate_up, down: (out, in)
STREAM_LAYERS = 8  # 8 layers of weights (55 MB) do not fit in a 32 MiB L3, as the model's 0.5 GB
Q_LINEAR_LAYERS = 2  # its torch side dequantizes every call: slow, so fewer layers
Q4_1 = GGMLQuantizationType.Q4_1
Q4_1_SCALE_MIN = torch.tensor([1 / 64, -1 / 8], dtype=torch.float16)
Pair = tuple[Callable[[], object], Callable[[], object]]  # (the C call, the torch call)


def prepare(dtype: torch.dtype) -> None:
    """At model load, not in the first step: in float32, build the C ops and set which run here
    (measured once per CPU, then cached); in bfloat16 on a CPU without it, warn (once)."""
    if dtype == torch.float32:
        op_choice.set_table(resolve())
    else:
        cpu_features.warn_if_bf16_emulated(dtype)


def resolve() -> dict[str, str]:
    """{op key: "c" or "torch"} under MINIVLLM_CUSTOM_OPS (see the module docstring)."""
    mode = os.environ.get(csrc_build.ENABLE_ENV, "auto")
    if mode not in ("auto", "c", "torch"):
        raise ValueError(f"{csrc_build.ENABLE_ENV}={mode!r}: use auto, c or torch")
    if mode == "torch" or csrc_build.load() is None:
        return dict.fromkeys(OPS, "torch")
    table = (dict.fromkeys(OPS, "c") if mode == "c"
             else {key: row["choice"] for key, row in load_or_measure().items()})
    return {**table, **prefill_override()}


PREFILL_ENV = "MINIVLLM_Q_LINEAR_PREFILL"
PREFILL_WAYS = ("auto", "c", "mm", "bf16")


def prefill_override() -> dict[str, str]:
    """{"q_linear/prefill": way} where PREFILL_ENV names one, else {} (measured)."""
    way = os.environ.get(PREFILL_ENV, "auto")
    if way not in PREFILL_WAYS:
        raise ValueError(f"{PREFILL_ENV}={way!r}: use one of {', '.join(PREFILL_WAYS)}")
    return {} if way == "auto" else {"q_linear/prefill": way}


def choice_file() -> Path:
    return csrc_build.build().with_suffix(f".t{torch.get_num_threads()}.json")


def load_or_measure(remeasure: bool = False) -> dict[str, dict]:
    """The cached timings of this build and thread count, else measured now and cached."""
    path = choice_file()
    if not remeasure and path.exists():
        try:
            record = json.loads(path.read_text())
            fresh = not _quieter_now(record["load_average"])
            if fresh and set(record["ops"]) == set(OPS) and "c_speedup" in record["ops"][OPS[0]]:
                return record["ops"]
        except (ValueError, KeyError, TypeError):
            pass  # a damaged or older file: measure again
    ops = measure()
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    record = {"threads": torch.get_num_threads(), "load_average": os.getloadavg()[0], "ops": ops}
    tmp.write_text(json.dumps(record, indent=1))
    os.replace(tmp, path)  # atomic: processes measuring at once each leave a whole file
    return ops


def _quieter_now(measured_at: float) -> bool:
    """A choice timed while the machine was oversubscribed (more runnable threads than cores:
    a parallel region then waits for a thread that is not running) is timed again once the
    load has halved."""
    cores = os.cpu_count() or 1
    return measured_at > cores and os.getloadavg()[0] < measured_at / 2


def faster(c: Callable[[], object], torch_fn: Callable[[], object],
           budget_s: float | None = None, other: str = "torch") -> dict:
    """The C and torch versions of an op compared (paired_ratio): {"choice", "c_speedup",
    "c_us", "torch_us"}, C kept where the median ratio says it is not slower, else `other`
    (the name of the way torch_fn runs it)."""
    ratio, c_s, torch_s = paired_ratio(c, torch_fn, BUDGET_S if budget_s is None else budget_s)
    return {"choice": "c" if ratio <= 1 else other, "c_speedup": round(1 / ratio, 3),
            "c_us": round(c_s * 1e6, 2), "torch_us": round(torch_s * 1e6, 2)}


@torch.inference_mode()
def measure() -> dict[str, dict]:
    """Time every op of OPS in C and in torch on this CPU (well under a second when quiet)."""
    result = {}
    for key in OPS:
        op, rows = key.split("/")
        if rows == "prefill":  # the C GEMM against the blocks dequantized for torch's sgemm
            result[key] = faster(*_q_linear(PREFILL_ROWS, mm=True), other="mm")
        else:
            result[key] = faster(*_cases[op](1 if rows == "few" else 32))
    return result


def _skinny_linear(rows: int) -> Pair:
    weights = [torch.full(shape, 0.01) for shape in LAYER_MATRICES * STREAM_LAYERS]
    splits = [split_rows(w, torch.get_num_threads()) for w in weights]
    xs = {n: torch.randn(rows, n) for n in (HIDDEN, INTER)}
    return (lambda: [custom_ops.skinny_linear_c(xs[w.shape[1]], w) for w in weights],
            lambda: [matmul(xs[s.shape[2]], s) for s in splits])


def _q_linear(rows: int, mm: bool = False) -> Pair:
    """Q4_1 blocks (the bundled GGUF's) of two layers (one with mm), each scale 1/64 and min
    -1/8 (fp16): the torch side dequantizes on every call, as its fallback does, or with mm in
    C into a scratch matrix for torch's sgemm (q_linear_mm). Packed where the model's layers
    are (quant_linear.repack)."""
    weights = []
    for out_features, in_features in LAYER_MATRICES * (1 if mm else Q_LINEAR_LAYERS):
        blocks = torch.randint(0, 256, (out_features, in_features // 32, 20), dtype=torch.uint8)
        blocks[..., :4] = Q4_1_SCALE_MIN.view(torch.uint8)
        weights.append(repack(QuantWeight(blocks.view(out_features, -1), Q4_1, in_features)))
    xs = {n: torch.randn(rows, n) for n in (HIDDEN, INTER)}
    other = custom_ops.q_linear_mm if mm else custom_ops.q_linear_torch
    return (lambda: [custom_ops.q_linear_c(xs[w.in_features], w) for w in weights],
            lambda: [other(xs[w.in_features], w) for w in weights])


def _add_rms_norm(rows: int) -> Pair:
    x, delta = torch.randn(rows, HIDDEN), torch.zeros(rows, HIDDEN)
    return (lambda: custom_ops.rms_norm_c(x, None, 1e-5, delta),
            lambda: custom_ops.rms_norm_torch(x, None, 1e-5, delta))


def _silu_and_mul(rows: int) -> Pair:
    gate_up = torch.randn(rows, 2 * INTER)
    return (lambda: custom_ops.silu_and_mul_c(gate_up),
            lambda: custom_ops.silu_and_mul_torch(gate_up))


def _paged_cache(rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A cache of rows sequences of CONTEXT tokens each, and their block tables."""
    blocks = CONTEXT // BLOCK
    cache = torch.randn(2, KV_HEADS, rows * blocks, BLOCK * HEAD_DIM)
    return cache, torch.randperm(rows * blocks).view(rows, blocks)


def _rope_and_cache(rows: int) -> Pair:
    cache, tables = _paged_cache(rows)
    qkv = torch.randn(rows, (HEADS + 2 * KV_HEADS) * HEAD_DIM)
    angles = torch.rand(CONTEXT + 1, HEAD_DIM // 2).repeat(1, 2)  # a true rotation: the
    sign = torch.cat([-torch.ones(HEAD_DIM // 2), torch.ones(HEAD_DIM // 2)])  # repeats stay finite
    args = (qkv, torch.full((rows,), CONTEXT), angles.cos(), angles.sin() * sign, HEADS,
            KV_HEADS, HEAD_DIM, cache, tables[:, -1] * BLOCK + BLOCK - 1)
    return (lambda: custom_ops.rope_and_cache_c(*args),
            lambda: custom_ops.rope_and_cache_torch(*args))


def _paged_decode(rows: int) -> Pair:
    cache, tables = _paged_cache(rows)
    q = torch.randn(rows, HEADS, HEAD_DIM)
    lens, scale = torch.full((rows,), CONTEXT), HEAD_DIM ** -0.5
    meta = AttentionMetadata(slot_mapping=torch.zeros(rows, dtype=torch.int64), num_decodes=rows,
                             decode_block_tables=tables, decode_seq_lens=lens)
    return (lambda: custom_ops.paged_decode_c(q, cache, tables, lens, scale),
            lambda: decode_torch(q, cache, meta, scale))


def _argmax_rows(rows: int) -> Pair:
    logits = torch.randn(rows, VOCAB)
    return lambda: custom_ops.argmax_c(logits), lambda: custom_ops.argmax_torch(logits)


def random_q8_blocks(vocab: int, seed: int | None = None) -> torch.Tensor:
    """Q8_0 blocks (vocab, HIDDEN / 32 * 34) in the file's layout: quants uniform in +-127,
    every scale 1/256 (tests/test_greedy_head.py builds its heads from these too)."""
    gen = None if seed is None else torch.Generator().manual_seed(seed)
    blocks = torch.randint(-127, 128, (vocab, HIDDEN // 32, 34), dtype=torch.int8,
                           generator=gen).view(torch.uint8)
    blocks[..., :2] = torch.tensor([1 / 256], dtype=torch.float16).view(torch.uint8)
    return blocks.view(vocab, -1)


def _greedy_head(rows: int) -> Pair:
    """A random Q8_0 head of the model's shape: the int8 screen with its float32 confirmation
    (greedy_head.py) against the logits and their argmax. Without the screen (no AVX-512
    VNNI) both sides are the logits."""
    head = QuantWeight(random_q8_blocks(VOCAB), GGMLQuantizationType.Q8_0, HIDDEN)
    screen, packed = build_screen(head.data, head.qtype, HIDDEN), repack(head)
    x = torch.randn(rows, HIDDEN)
    logits = lambda: custom_ops.argmax_c(custom_ops.q_linear_c(x, packed))  # noqa: E731
    return (logits if screen is None else lambda: screen_tokens(x, screen)), logits


_cases = {"skinny_linear": _skinny_linear, "q_linear": _q_linear, "add_rms_norm": _add_rms_norm,
          "silu_and_mul": _silu_and_mul, "rope_and_cache": _rope_and_cache,
          "paged_decode": _paged_decode, "argmax_rows": _argmax_rows, "greedy_head": _greedy_head}


def table(ops: dict[str, dict]) -> list[dict]:
    """Rows for print_table: op, rows, which way it runs, both timings and the C speedup (the
    median of the rounds' ratios, which decided)."""
    rows = {"few": "1-7", "many": "8+", "prefill": f"{op_choice.PREFILL_ROWS}+"}
    return [{"op": key.split("/")[0], "rows": rows[key.split("/")[1]],
             "runs": row["choice"], "c_us": row["c_us"], "torch_us": row["torch_us"],
             "c_speedup": row["c_speedup"]} for key, row in ops.items()]


if __name__ == "__main__":  # build, time each op against torch again, print the choice
    import sys

    from minivllm.bench.common import print_table
    try:
        csrc_build.build()
    except csrc_build.KernelBuildError as exc:
        sys.exit(f"could not build the CPU ops: {exc}")
    print_table(table(load_or_measure(remeasure=True)),
                ["op", "rows", "runs", "c_us", "torch_us", "c_speedup"])
    print(f"cached in {choice_file()}")
