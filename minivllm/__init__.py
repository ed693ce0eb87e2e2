"""minivllm: a small multi-process LLM serving engine shaped like vLLM V1.

Each chapter of the handbook adds one module. The package imports nothing heavy at the
top level, so `import minivllm` stays cheap for child processes.
"""

__version__ = "0.1.0"


def __getattr__(name: str):
    # `from minivllm import LLM` without importing torch for every child process.
    if name == "LLM":
        from minivllm.entrypoints.llm import LLM
        return LLM
    if name == "SamplingParams":
        from minivllm.sampling_params import SamplingParams
        return SamplingParams
    raise AttributeError(f"module 'minivllm' has no attribute {name!r}")
