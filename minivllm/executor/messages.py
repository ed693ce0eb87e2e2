"""What crosses the executor's MessageQueues: a tagged union of msgspec Structs, never pickle.

    executor --broadcast MessageQueue--> every worker     RPCRequest  = ExecuteModel | RPCCall
    executor <--one MessageQueue(1, 1) per worker--        RPCResponse = StepResult | RPCResult
                                                                        | RPCError

Each Struct is a msgpack array whose first element is its tag (the class name), so the decoder
knows the type from one string and validates every field; numpy arrays travel as raw frames
(serial.py). vLLM sends (method, args, kwargs, output_rank) tuples and pickles them
(vllm/distributed/device_communicators/shm_broadcast.py (MessageQueue.enqueue); the worker unpacks them at
vllm/v1/executor/multiproc_executor.py (WorkerProc._execute_worker_rpc)): any process that can write the ring then runs
code in every worker. Here a worker can only be asked to run a public method of its Worker
with msgpack-able arguments.

`call_id` numbers the calls. A reply carries the id of the call it answers, so a reply that
arrives after its caller gave up (a timeout) is recognised and dropped instead of being taken
for the answer to the next call.
"""

from __future__ import annotations

from typing import Any, Union

import msgspec

from minivllm.engine.scheduler_output import ModelRunnerOutput, SchedulerOutput


class ExecuteModel(msgspec.Struct, tag=True, array_like=True, gc=False):
    """The hot path: one step, answered by the output rank alone."""
    call_id: int
    output_rank: int
    scheduler_output: SchedulerOutput


class RPCCall(msgspec.Struct, tag=True, array_like=True, gc=False):
    """worker.<method>(*args, **kwargs) on every rank; output_rank None: every rank replies."""
    call_id: int
    method: str
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    output_rank: int | None = None


class StepTiming(msgspec.Struct, array_like=True, gc=False):
    """The output rank's clock (time.perf_counter, CLOCK_MONOTONIC: one clock for every
    process on the machine) at the points the executor cannot see."""
    received: float  # the step came out of the broadcast queue
    forward_s: float  # execute_model, collectives included
    collective_s: float  # of which all-reduce and gather
    sent: float  # just before the reply was enqueued


class StepResult(msgspec.Struct, tag=True, array_like=True, gc=False):
    call_id: int
    output: ModelRunnerOutput
    timing: StepTiming


class RPCResult(msgspec.Struct, tag=True, array_like=True, gc=False):
    call_id: int
    rank: int
    result: Any = None


class RPCError(msgspec.Struct, tag=True, array_like=True, gc=False):
    call_id: int
    rank: int
    error: str  # the worker's traceback


RPCRequest = Union[ExecuteModel, RPCCall]
RPCResponse = Union[StepResult, RPCResult, RPCError]
