"""The errors a front end sees when the engine core cannot answer.

In vLLM: vllm/v1/engine/exceptions.py (EngineGenerateError, EngineDeadError).
"""

from __future__ import annotations


class EngineGenerateError(Exception):
    """One request failed in the engine core; the engine itself is still serving."""


class EngineDeadError(Exception):
    """The engine core process is gone (killed, crashed, or shut down): no request can
    complete. Every pending call and every later call on the client raises it."""

    def __init__(self, message: str = "the engine core died; see its log above "
                                      "(stderr of the process that started it)") -> None:
        super().__init__(message)
