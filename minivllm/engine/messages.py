"""The engine's wire types: what the front end and the engine core send each other.

Every message is a msgspec Struct encoded as a msgpack array (`array_like=True`: field
names never cross the wire) with defaults omitted. Token ids travel as numpy int32 arrays,
which `minivllm.serial` moves as raw bytes, never as lists of Python ints (chapter 04).
In vLLM: vllm/v1/engine/__init__.py.
"""

from __future__ import annotations

import enum

import msgspec
import numpy as np

from minivllm.sampling_params import SamplingParams


class EngineCoreRequestType(bytes, enum.Enum):
    """The first frame of every front end -> engine core message: one byte, a name in code."""

    ADD = b"\x00"
    ABORT = b"\x01"
    START_DP_WAVE = b"\x02"
    UTILITY = b"\x03"
    EXECUTOR_FAILED = b"\x04"  # sent by the engine core to itself when a worker dies


class FinishReason(enum.IntEnum):
    STOP = 0
    LENGTH = 1
    ABORT = 2
    ERROR = 3

    def __str__(self) -> str:
        return self.name.lower()


class EngineCoreRequest(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    request_id: str
    prompt_token_ids: np.ndarray  # int32, shape (n,)
    sampling_params: SamplingParams
    arrival_time: float = 0.0
    client_index: int = 0


class EngineCoreOutput(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    request_id: str
    new_token_ids: np.ndarray  # int32 tokens sampled this step
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None
    num_cached_tokens: int = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class UtilityOutput(msgspec.Struct, array_like=True, gc=False):
    call_id: int
    failure_message: str | None = None
    result: object = None


class EngineCoreOutputs(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """One step's outputs for one client; also the carrier of utility replies and of death."""

    engine_index: int = 0
    outputs: list[EngineCoreOutput] = []
    finished_requests: list[str] = []
    utility_output: UtilityOutput | None = None
    timestamp: float = 0.0
    engine_dead: bool = False
