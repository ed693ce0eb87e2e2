"""minivllm: a small multi-process LLM serving engine shaped like vLLM V1.

Each chapter of the handbook adds one module. The package imports nothing heavy at the
top level, so `import minivllm` stays cheap for child processes.
"""

import os

__version__ = "0.1.0"
# The vLLM release whose code minivllm follows and the handbook cites. Code comments name vLLM's
# files and symbols (they survive a release); the chapters quote checked `path:line` pointers
# into this release.
VLLM_VERSION = "0.33.0"

# Allocations of 2 MiB and more in 2 MiB pages (madvise'd transparent huge pages), weights and
# KV cache included: a decode step streams 0.5 GB of float32 weights, through 4 KiB pages about
# 130,000 TLB entries a step (`minivllm bench throughput` measures decode). torch reads this once, at
# its first allocation, so it only takes effect when minivllm is imported before torch.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

# OpenMP threads (torch's and the C ops', one libgomp) spin 20,000 rounds at the end of a parallel
# region before they sleep, not libgomp's 300,000. The next op comes within microseconds, so
# short spins keep a step's latency; on a machine shared with other programs a long spin holds a
# core while the region's other thread waits for one. Measured in-process at 32 streams beside 2
# busy loops: 25 tok/s with libgomp's default, 125 with 20,000, 135 with OMP_WAIT_POLICY=passive;
# quiet, 20,000 and the default serve the same (358 against 335-353 tok/s; 158 against 138-159 at
# one stream), where passive falls to 60 at one stream (a futex wake per region). vLLM sets the
# same knob for Intel's OpenMP, KMP_BLOCKTIME=5 ms (vllm/utils/ompmultiprocessing.py:86-90), and
# pins each worker's threads to its cores. libgomp reads it when torch loads, like the above.
os.environ.setdefault("GOMP_SPINCOUNT", "20000")

# MINIVLLM_CPU_ARCH=x86-64-v3 runs minivllm as on an AVX2-only CPU: the C ops are built for it
# (model/csrc_build.py) and torch's own kernels (ATen, oneDNN, MKL) are held to AVX2 too, so
# bfloat16 is emulated as there. Like the line above, only when minivllm is imported first.
if os.environ.get("MINIVLLM_CPU_ARCH") == "x86-64-v3":
    for _key, _isa in (("ATEN_CPU_CAPABILITY", "avx2"), ("ONEDNN_MAX_CPU_ISA", "AVX2"),
                       ("MKL_ENABLE_INSTRUCTIONS", "AVX2")):
        os.environ.setdefault(_key, _isa)


def __getattr__(name: str):
    # `from minivllm import LLM` (or AsyncLLM) without importing torch for every child process.
    if name == "LLM":
        from minivllm.entrypoints.llm import LLM
        return LLM
    if name == "AsyncLLM":
        from minivllm.engine.async_llm import AsyncLLM
        return AsyncLLM
    if name == "SamplingParams":
        from minivllm.sampling_params import SamplingParams
        return SamplingParams
    raise AttributeError(f"module 'minivllm' has no attribute {name!r}")
