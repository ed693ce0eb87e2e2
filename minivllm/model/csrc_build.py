"""Build csrc/cpu_ops.c, paged_attention.c, quant_ops.c, quant_gemv.c and decode_step.c for this
machine and load them with ctypes.

The source is compiled on first use with the system's C compiler for this CPU (-march=native),
into a cache keyed by the source, the flags and the CPU, in about a second; `python -m
minivllm.model.csrc_build` does it ahead of time (`python -m minivllm.model.op_selection`
also times each op against torch). Without a compiler, or with MINIVLLM_CUSTOM_OPS=torch, `load()` returns
None and the model runs the torch versions. MINIVLLM_CPU_ARCH=x86-64-v3 builds for an AVX2 CPU
without AVX-512 (minivllm then also holds torch's kernels to AVX2: see minivllm/__init__.py).

Two compile steps on purpose: -ffast-math (vectorised expf, reassociated sums) applies to the
ops' object only. Linking a shared library with it would, on gcc 12, add crtfastmath, which
sets flush-to-zero for the whole process, torch included.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

CSRC = Path(__file__).with_name("csrc")
SOURCES = [CSRC / name for name in ("cpu_ops.c", "paged_attention.c", "quant_ops.c",
                                    "quant_gemv.c", "decode_step.c", "greedy_head.c")]
# the headers are in the build key: a change rebuilds
HEADERS = [CSRC / "kv_dtype.h", CSRC / "quant_blocks.h", CSRC / "thread_scratch.h"]
ENABLE_ENV = "MINIVLLM_CUSTOM_OPS"  # "auto" (the default), "c" or "torch": see custom_ops.py
ARCH_ENV = "MINIVLLM_CPU_ARCH"  # gcc's -march: "native" (the default), or e.g. "x86-64-v3"
LINK_FLAGS = ["-shared", "-fopenmp"]  # libgomp: torch's copy is already loaded, and shared
LIBS = ["-lm"]  # with libmvec, the vector expf


class KernelBuildError(RuntimeError):
    pass


def cache_dir() -> Path:
    root = os.environ.get("MINIVLLM_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "minivllm")
    return Path(root) / "kernels"


def compile_flags() -> list[str]:
    """-march from MINIVLLM_CPU_ARCH: "x86-64-v3" builds the ops as for an AVX2-only CPU (no
    AVX-512) on any x86 machine, to see what a reader with such a CPU gets."""
    arch = os.environ.get(ARCH_ENV, "native")
    if not re.fullmatch(r"[\w.+-]+", arch):
        raise KernelBuildError(f"{ARCH_ENV}={arch!r} is not a -march name: try native or "
                               f"x86-64-v3")
    flags = ["-O3", f"-march={arch}", "-ffast-math", "-fopenmp", "-fPIC"]
    if platform.machine() in ("x86_64", "AMD64"):
        flags.append("-mprefer-vector-width=512")  # gcc's default stops at 256 bits
    return flags


def _cpu_id() -> str:
    try:  # -march=native binds the build to this CPU's instruction set
        with open("/proc/cpuinfo") as f:
            flags = [line for line in f if line.startswith(("flags", "Features"))]
        return flags[0] if flags else platform.processor()
    except OSError:
        return platform.processor()


def build(compiler: str | None = None) -> Path:
    """Compile the kernel unless the cache has it; returns the shared library's path."""
    cc = compiler or os.environ.get("CC") or "gcc"
    if shutil.which(cc) is None:
        raise KernelBuildError(f"no C compiler {cc!r} on PATH (set CC, or install gcc)")
    sources, flags = [src.read_bytes() for src in SOURCES + HEADERS], compile_flags()
    key = hashlib.sha256(b"\0".join([*sources, " ".join(flags + LINK_FLAGS).encode(),
                                     cc.encode(), _cpu_id().encode()])).hexdigest()[:16]
    target = cache_dir() / f"cpu_ops-{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        objs, lib = [str(Path(tmp, f"{src.stem}.o")) for src in SOURCES], Path(tmp, "k.so")
        compiles = [[cc, *flags, "-c", str(src), "-o", obj] for src, obj in zip(SOURCES, objs)]
        for cmd in [*compiles, [cc, *LINK_FLAGS, *objs, "-o", str(lib), *LIBS]]:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            if done.returncode:
                raise KernelBuildError(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
        os.replace(lib, target)  # atomic: processes building at once each get a whole file
    return target


SIGNATURES = {  # name: argument types; every op returns int, 0 for done
    "paged_decode": "pi" + "ppppp" + "i" * 7 + "f" + "i",
    "argmax_rows": "ppii",
    "skinny_linear": "ppp" + "iii",
    "rope_and_cache": "pipppp" + "iii" + "pp" + "ii" + "p" + "i",
    "silu_and_mul": "ppii",
    "add_rms_norm": "pppp" + "ii" + "f",
    "q_linear": "ppp" + "iiii",
    "q_repack": "pp" + "iii",
    "q_takes_packed": "i",
    "q_gemm_rows": "",
    "q_dequant": "pp" + "iii",
    "q_lane_order": "pp" + "iii",
    "decode_layers": "pppp" + "p" + "pppppp" + "p" + "ff",
    "greedy_head": "pii" + "ppp" + "ip",
    "greedy_head_built": "",
}
CTYPES = {"p": ctypes.c_void_p, "i": ctypes.c_int64, "f": ctypes.c_float}


@functools.cache
def load() -> ctypes.CDLL | None:
    """The ops library, built if needed; None (with a warning, once) where it cannot be."""
    if os.environ.get(ENABLE_ENV, "c") == "torch":
        return None
    try:
        lib = ctypes.CDLL(str(build()))
    except (KernelBuildError, OSError, subprocess.SubprocessError) as exc:
        warnings.warn(f"the model runs its torch ops: the C ops are unavailable ({exc})",
                      stacklevel=2)
        return None
    for name, sig in SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = [CTYPES[c] for c in sig], ctypes.c_int
    return lib


if __name__ == "__main__":  # build only; `python -m minivllm.model.op_selection` also times them
    try:
        print(build())
    except KernelBuildError as exc:
        sys.exit(f"could not build the CPU ops: {exc}")
