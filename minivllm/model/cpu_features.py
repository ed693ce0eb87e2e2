"""What this CPU runs natively: the instruction-set flags that decide which kernels win here, and
whether bfloat16 is native or emulated.

bfloat16 runs natively with avx512_bf16 (or AMX): oneDNN then multiplies bf16 directly. Without
them torch still runs it, converting through float32 in software, and an AVX2-only EPYC ran a
bf16 2048^2 matmul at 1.2 GFLOP/s: a bf16 model there is slower than float32, not faster.
"""

from __future__ import annotations

import functools
import os
import warnings

import torch

from minivllm.model import csrc_build
from minivllm.model.linear import Linear
from minivllm.model.paired_timing import paired_ratio

FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx")  # "amx": amx_bf16 or amx_tile
BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # either makes bfloat16 native


@functools.cache
def _proc_flags() -> frozenset[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def cpu_flags() -> dict[str, bool]:
    """The flags that matter here, as /proc/cpuinfo lists them (the hardware's, not what an
    emulation lets the kernels use: see isa())."""
    flags = _proc_flags()
    found = {name: name in flags for name in FLAGS}
    found["amx"] = bool({"amx_bf16", "amx_tile"} & flags)
    return found


def isa() -> dict[str, str | bool]:
    """What the kernels use: torch's vector level, the C ops' -march, and bfloat16 natively."""
    return {"torch": torch.backends.cpu.get_cpu_capability(),
            "c_ops_march": os.environ.get(csrc_build.ARCH_ENV, "native"),
            "bf16_native": bf16_missing() is None}


def bf16_missing() -> str | None:
    """None where bfloat16 runs natively, else why not, in one line naming the missing flag."""
    if not set(BF16_FLAGS) & _proc_flags():
        return "this CPU has no avx512_bf16 or amx_bf16 flag"
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return (f"oneDNN does not use bfloat16 here, ONEDNN_MAX_CPU_ISA="
                f"{os.environ.get('ONEDNN_MAX_CPU_ISA', '(unset)')}")
    return None


@torch.inference_mode()
def bf16_slowdown(rows: int = 1, budget_s: float = 0.2) -> float:
    """How many times longer one of SmolLM2's MLP matmuls (576 -> 3072) takes in bfloat16 than
    in float32 through the model's own Linear, timed side by side (paired_timing.py)."""
    w, x = torch.randn(3072, 576) / 24, torch.randn(rows, 576)
    parts = torch.get_num_threads()
    bf16, fp32 = Linear(w.bfloat16(), parts), Linear(w, parts)
    x16 = x.bfloat16()
    return paired_ratio(lambda: bf16(x16), lambda: fp32(x), budget_s)[0]


@functools.cache
def warn_if_bf16_emulated(dtype: torch.dtype) -> str | None:
    """Once per process: warn that bfloat16 is emulated here and how much slower it measured."""
    reason = bf16_missing() if dtype == torch.bfloat16 else None
    if reason is None:
        return None
    message = (f"bfloat16 is emulated on this CPU ({reason}). The model's matmuls ran "
               f"{bf16_slowdown(1):.1f}x (1 row) and {bf16_slowdown(32):.1f}x (32 rows) slower "
               f"than in float32 here; use dtype='float32'")
    warnings.warn(message, stacklevel=3)
    return message
