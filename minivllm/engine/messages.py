"""The engine's wire types: what the front end and the engine core send each other.

Every message is a msgspec Struct encoded as a msgpack array (`array_like=True`: field
names never cross the wire, only values in field order). `omit_defaults=True` is set as vLLM
does, but msgspec honours it only for map-encoded Structs: an array always holds every field
(measured in chapter 04). Token ids travel as numpy int32 arrays, which `minivllm.serial`
moves as raw bytes (out of band when >= 256 B), never as lists of Python ints: decoding a list
creates one Python int per token, and that, not the byte format, is the cost (chapter 04).

Wire format. Front end -> engine core (front-end ROUTER, engine DEALER):

    frame  sender's view (ROUTER)           engine's view (DEALER)   holds
    0      identity: DP rank, 2 bytes LE    -                        ROUTER strips/adds it
    1      EngineCoreRequestType, 1 byte    frame 0                  ADD, ABORT, UTILITY, ...
    2      msgpack body                     frame 1                  the payload below
    3..    out-of-band array buffers        frame 2..                e.g. prompt_token_ids

    type    payload
    ADD     EngineCoreRequest
    ABORT   list[str]: request ids
    UTILITY UtilityRequest

Before anything else the engine's DEALER sends one message, EngineCoreReadyResponse: a ROUTER
can only route to a peer it has heard from (chapter 03).

Engine core -> front end (engine PUSH, front-end PULL): [msgpack EngineCoreOutputs,
out-of-band buffers...]. No type byte: every message is EngineCoreOutputs, which also carries
utility replies (utility_output), except the last message of an engine that fails: the one
raw frame ENGINE_CORE_DEAD (as vLLM: vllm/v1/engine/core.py (EngineCoreProc)). A raw frame because the
death notice must not depend on what may have failed (the encoder, a Struct's schema), and the
client recognises it before decoding anything. It cannot be mistaken for an EngineCoreOutputs:
that body always starts with a msgpack array header (0x90-0x9f, 0xdc), this one with "E".

A step's new tokens travel as small lists (new_token_ids: list[int]), not one numpy array per
output: at batch 32 with one token each, lists encode and decode ~10x faster than per-output
arrays and ~2x faster than one flat array for the step (`minivllm bench overhead` measures
all three in its wire rows; chapter 07 shows them).

In vLLM: vllm/v1/engine/__init__.py (EngineCoreRequestType, EngineCoreRequest,
EngineCoreOutput, UtilityOutput, EngineCoreOutputs, EngineCoreReadyResponse); the framing:
SyncMPClient._send_input in vllm/v1/engine/core_client.py (identity, type, frames...) and
EngineCoreProc.process_input_sockets in vllm/v1/engine/core.py (type_frame, *data_frames).
"""

from __future__ import annotations

import enum
from typing import Any

import msgspec
import numpy as np

from minivllm.sampling_params import SamplingParams
from minivllm.serial import Int32Array

TOKEN_DTYPE = np.int32  # vocabularies fit in 31 bits; half the bytes of int64


class EngineCoreRequestType(bytes, enum.Enum):
    """Frame 1 of every front end -> engine core message: one byte on the wire, a name in code."""

    ADD = b"\x00"
    ABORT = b"\x01"
    START_DP_WAVE = b"\x02"  # DP: wake idle engines for a new wave of requests
    UTILITY = b"\x03"  # call a method on the engine core; answered in EngineCoreOutputs
    EXECUTOR_FAILED = b"\x04"  # put by the engine core on its own queue when a worker dies
    WAKEUP = b"\x05"  # put on the engine core's own queue to unblock it at shutdown


ENGINE_CORE_DEAD = b"ENGINE_CORE_DEAD"  # the last frame a failing engine core sends


class FinishReason(enum.IntEnum):
    """Why a request finished. An int on the wire: one byte instead of a string."""

    STOP = 0
    LENGTH = 1
    ABORT = 2
    ERROR = 3

    def __str__(self) -> str:
        return self.name.lower()


class EngineCoreRequest(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """ADD: one tokenized request, front end -> engine core."""

    request_id: str
    prompt_token_ids: Int32Array  # TOKEN_DTYPE, shape (n,); decoding rejects any other array
    sampling_params: SamplingParams
    arrival_time: float = 0.0
    client_index: int = 0  # which front end to answer (several API servers share engines)


class UtilityRequest(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """UTILITY: call `method(*args)` on the engine core; the reply carries call_id back."""

    call_id: int
    method: str
    args: list[Any] = []
    client_index: int = 0


class EngineCoreReadyResponse(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """The engine's first message on its DEALER: lets the ROUTER route to it, and reports
    what startup decided."""

    engine_index: int
    num_gpu_blocks: int = 0
    block_size: int = 0
    max_model_len: int = 0


class EngineCoreOutput(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """One request's progress in one step."""

    request_id: str
    new_token_ids: list[int]  # tokens sampled this step (usually one: a list is cheapest)
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None  # the stop string or token id that matched
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    error: str | None = None  # with FinishReason.ERROR: what was wrong with the request
    # the new token's logprobs when asked for: (token ids, logprobs, rank), the sampled token
    # first, then the top ones (vLLM: new_logprobs, a LogprobsLists, vllm/v1/engine/__init__.py)
    new_logprobs: tuple[list[int], list[float], int] | None = None
    # prompt positions scored in this step's chunk: per position the next prompt token and the
    # top ones, their logprobs, and the prompt token's rank (vLLM: new_prompt_logprobs_tensors)
    new_prompt_logprobs: tuple[list[list[int]], list[list[float]], list[int]] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class UtilityOutput(msgspec.Struct, array_like=True, gc=False):
    """The reply to a UtilityRequest: result, or failure_message if the call raised."""

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


# --- the start-up handshake between the launcher and each engine (engine/launcher.py) -------
ADDRESSES_TIMEOUT_S = 60.0  # the engine's wait for the launcher's reply to HELLO


class HandshakeHello(msgspec.Struct, tag="HELLO", array_like=True):
    engine_index: int
    pid: int


class HandshakeReady(msgspec.Struct, tag="READY", array_like=True):
    response: EngineCoreReadyResponse


class HandshakeFailed(msgspec.Struct, tag="FAILED", array_like=True):
    error: str  # the engine's traceback


HandshakeMessage = HandshakeHello | HandshakeReady | HandshakeFailed


class ClientAddresses(msgspec.Struct):
    """What one client (API server) of engines it did not start needs: where it binds its
    ROUTER and PULL, and the engine pids to watch (vLLM passes a dict with the same keys)."""

    input_address: str
    output_address: str
    engine_pids: list[int] = []
    # tcp: the launcher's bound, listening sockets for the two addresses (they pickle to a
    # spawned API server as duplicates), which the client's ZMQ sockets adopt
    listeners: Any = None


class EngineZmqAddresses(msgspec.Struct, array_like=True):
    """Where the clients (API servers) listen: client i at inputs[i] and outputs[i]."""

    inputs: list[str]
    outputs: list[str]

    def for_client(self, i: int, engine_pids: list[int] = (), listeners: Any = None
                   ) -> ClientAddresses:
        """What AsyncLLM(config, client_addresses, client_index=i) takes."""
        return ClientAddresses(self.inputs[i], self.outputs[i], list(engine_pids), listeners)
