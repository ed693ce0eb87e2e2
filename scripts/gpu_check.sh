#!/usr/bin/env bash
# GPU check for chapter 06 (CUDA IPC weight hand-off). Run on a machine with an NVIDIA GPU and a
# CUDA build of torch; finishes in under 3 minutes. Everything here also passes (as SKIPs) on a CPU.
#
#   PYTHON=/path/to/python scripts/gpu_check.sh      # default: .venv/bin/python
#
# Steps: the CUDA tests of minivllm.distributed.weight_transfer, exercise 301's solution with its
# CUDA test, the chapter in quick mode (its GPU cells run), and `bench weights --quick --cuda`.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
export MINIVLLM_QUICK=1 MPLBACKEND=Agg

if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check: torch at $PY sees no CUDA GPU (a CPU build, or no driver)."
    echo "Install a CUDA build of torch 2.13 (the wheel for your CUDA version from" \
         "https://download.pytorch.org/whl/) or point PYTHON at one."
    exit 2
fi
"$PY" -c "import torch; print('torch', torch.__version__, '|', torch.cuda.get_device_name(0))"

failed=0
step() {  # step NAME SECONDS CMD...: run with a time limit, report PASS/FAIL
    local name=$1 limit=$2; shift 2
    local start=$SECONDS
    echo "=== $name"
    if timeout "$limit" "$@"; then echo "=== PASS $name ($((SECONDS - start)) s)"
    else echo "=== FAIL $name (exit $?, $((SECONDS - start)) s)"; failed=1; fi
}

step "CUDA tests of weight_transfer" 60 "$PY" -m pytest -q -rs tests/test_weight_transfer.py -k cuda
step "exercise 301 solution (its CUDA test runs)" 30 "$PY" judge.py 301 --solution
step "chapter 06, quick mode, GPU cells run" 90 "$PY" -m jupyter nbconvert --to notebook --execute \
    chapters/06_cuda_ipc.ipynb --output-dir /tmp --output 06_cuda_ipc.gpu
grep -o 'CUDA IPC round, [0-9][^"]*\|same block: [TF][a-z]*' /tmp/06_cuda_ipc.gpu.ipynb \
    || echo "(the chapter's CUDA cells printed nothing)"
step "bench weights --quick --cuda" 60 "$PY" -m minivllm.cli bench weights --quick --cuda

[ "$failed" = 0 ] && echo "gpu_check: all passed" || echo "gpu_check: some steps FAILED (see above)"
exit "$failed"
