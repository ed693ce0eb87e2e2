"""WorkerProc: one tensor-parallel worker in its own process, reading the executor's broadcast.

    executor ──broadcast MessageQueue (1 writer, N readers)──> WorkerProc rank 0 .. N-1
    executor <──reply MessageQueue(1, 1), one per worker────── each WorkerProc

The process is started by utils/mp.launch, with vLLM's two pipes: the ready pipe carries the
handles of the reply queues, by rank (this worker's own; across nodes rank 0's also carries
the other nodes' ranks', see worker/multinode.py) (vLLM: WorkerProc._init_message_queues in
vllm/v1/executor/multiproc_executor.py, sent by WorkerProc.worker_main, read by
WorkerProc.wait_for_ready), the death pipe tells it to stop
(b"stop") or that the engine core is gone (EOF). Then the worker loops: dequeue a request, run
it, and reply if it is the output rank (vLLM's WorkerProc.worker_busy_loop).

A failed forward pass leaves the ranks out of step in their collectives (the others wait in an
all-reduce this rank never joins), so a rank whose step fails replies with the error if it is
the output rank and then exits: the executor's monitor sees the death at once. A failed
collective_rpc call is only reported: the workers stay in step.

When the engine core dies (SIGKILL included) the death pipe reads EOF: the worker leaves its
loop, and as a survivor it unlinks the broadcast ring and ipc files its dead creator left.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import traceback
from multiprocessing import resource_tracker
from multiprocessing.shared_memory import _posixshmem  # type: ignore[attr-defined]

from minivllm.distributed import parallel_state
from minivllm.distributed.shm_broadcast import Handle, MessageQueue, QueueShutdown
from minivllm.engine.config import EngineConfig
from minivllm.executor.messages import (ExecuteModel, RPCCall, RPCError, RPCRequest, RPCResult,
                                        StepResult, StepTiming)
from minivllm.serial import MsgpackDecoder, MsgpackEncoder
from minivllm.utils import tracing
from minivllm.utils.mp_child import ChildLink
from minivllm.worker import multinode
from minivllm.worker.worker import Worker

logger = logging.getLogger(__name__)

READY_TIMEOUT_S = 60.0  # every queue attached within this, or the start failed
# The reply queue's writer is this worker; its reader is the executor, which waits for the
# reply through a whole forward pass. Spinning that long would take a core from the ranks
# doing the work (3 ranks + the engine core on 2 cores), so the executor spins only this long
# after the broadcast, then sleeps in poll until the worker's notify wakes it.
REPLY_SPIN_S = 0.0005
EXIT_STEP_FAILED = 1
REPLY_CHUNK_BYTES = 1 << 16  # a step's sampled ids for hundreds of rows; larger overflows
REPLY_CHUNKS = 4


def process_title(rank: int, world_size: int) -> str:
    """vLLM's names with our prefix (vLLM: set_process_title(name="Worker_TP0") in
    WorkerProc.setup_proc_title_and_log_prefix)."""
    return f"MINIVLLM::Worker_TP{rank}" if world_size > 1 else "MINIVLLM::Worker"


class WorkerProc:
    def __init__(self, config: EngineConfig, rank: int, broadcast_handle: Handle | None,
                 distributed_init_method: str) -> None:
        self.rank = rank
        self.worker = Worker(config, rank, distributed_init_method)
        self.reply_handles: dict[int, Handle] = {}  # what the ready pipe carries, by rank
        self.watches: list = []  # PeerWatch threads (a remote reader's watch on its leader)
        if config.nnodes_within_dp > 1:  # the group first: it carries the handles between nodes
            broadcast_handle = multinode.init_worker_queues(self, config, broadcast_handle)
        else:
            self.rpc_broadcast_mq = MessageQueue.create_from_handle(
                broadcast_handle, rank, decoder=MsgpackDecoder(RPCRequest))
            self.worker_response_mq = MessageQueue(1, 1, REPLY_CHUNK_BYTES, REPLY_CHUNKS,
                                                   busy_loop_s=REPLY_SPIN_S)
            self.reply_handles[rank] = self.worker_response_mq.export_handle()
        self.broadcast_handle = broadcast_handle
        self._lock, self._closed = threading.Lock(), False  # wake_up() vs shutdown() race

    def wait_until_ready(self) -> None:
        self.rpc_broadcast_mq.wait_until_ready(READY_TIMEOUT_S)
        self.worker_response_mq.wait_until_ready(READY_TIMEOUT_S)

    def worker_busy_loop(self) -> None:
        while True:
            request = self.rpc_broadcast_mq.dequeue()
            if isinstance(request, ExecuteModel):
                self._execute_model(request)
            else:
                self._execute_rpc(request)

    def _execute_model(self, request: ExecuteModel) -> None:
        received = time.perf_counter()
        tp = parallel_state.get_tp_group()
        tp.comm_s = 0.0
        try:
            output = self.worker.execute_model(request.scheduler_output)
        except Exception:
            if self.rank == request.output_rank:
                self.worker_response_mq.enqueue(RPCError(request.call_id, self.rank,
                                                         traceback.format_exc()))
            raise  # the process exits: its peers are out of step (see the module docstring)
        if self.rank == request.output_rank:
            done = time.perf_counter()
            timing = StepTiming(received, done - received, tp.comm_s, done)
            self.worker_response_mq.enqueue(StepResult(request.call_id, output, timing))

    def _execute_rpc(self, request: RPCCall) -> None:
        try:
            method = getattr(self.worker, request.method, None)
            if request.method.startswith("_") or not callable(method):
                raise AttributeError(f"Worker has no public method {request.method!r}")
            reply = RPCResult(request.call_id, self.rank, method(*request.args, **request.kwargs))
        except Exception:
            logger.exception("worker %d: collective_rpc %r failed", self.rank, request.method)
            reply = RPCError(request.call_id, self.rank, traceback.format_exc())
        if request.output_rank is None or request.output_rank == self.rank:
            try:
                self.worker_response_mq.enqueue(reply)
            except TypeError as e:  # a result msgpack cannot carry: say which, keep serving
                self.worker_response_mq.enqueue(RPCError(request.call_id, self.rank, str(e)))

    def wake_up(self) -> None:
        """From another thread: make a blocked dequeue or enqueue raise QueueShutdown."""
        with self._lock:
            if not self._closed:
                self.rpc_broadcast_mq.shutdown()
                self.worker_response_mq.shutdown()

    def shutdown(self, engine_core_died: bool) -> None:
        """Close the queues (an orphan gets SIGTERM a second after the death pipe's EOF,
        utils/mp_child.PARENT_DEATH_GRACE_S: this must be quick)."""
        for watch in self.watches:  # before the queues' zmq contexts are terminated
            watch.stop()
        with self._lock:
            self._closed = True
            for mq in (self.rpc_broadcast_mq, self.worker_response_mq):
                mq.close()
        if engine_core_died:  # its ring and ipc files are ours to remove now
            unlink_queue_files(self.broadcast_handle)


def unlink_queue_files(handle: Handle) -> None:
    """Remove a MessageQueue's shared-memory segment and ipc socket files by name: what its
    writer would have removed had it not been killed. Missing ones are skipped."""
    if handle.buffer_handle is not None:
        name = "/" + handle.buffer_handle[3]
        try:
            _posixshmem.shm_unlink(name)
        except FileNotFoundError:
            pass
        else:  # the dead creator registered it with the (shared) resource tracker
            resource_tracker.unregister(name, "shared_memory")
    for addr in (handle.local_subscribe_addr, handle.local_notify_addr):
        if addr and addr.startswith("ipc://"):
            try:
                os.unlink(addr[len("ipc://"):])
            except FileNotFoundError:
                pass


def worker_main(link: ChildLink, config: EngineConfig, rank: int, broadcast_handle: Handle,
                distributed_init_method: str) -> None:
    """The target that utils/mp.launch runs in the worker process."""
    from setproctitle import setproctitle
    setproctitle(process_title(rank, config.tensor_parallel_size))
    tracing.set_process_name(process_title(rank, config.tensor_parallel_size))
    proc = WorkerProc(config, rank, broadcast_handle, distributed_init_method)
    link.ready(proc.reply_handles)

    def stop_on_request() -> None:  # the death pipe said stop (or EOF): wake the loop
        link.wait_stop()
        proc.wake_up()

    threading.Thread(target=stop_on_request, daemon=True, name="stop-on-request").start()
    code = 0
    try:
        proc.wait_until_ready()
        if proc.rpc_broadcast_mq.remote_socket is not None:  # the writer is on another node
            multinode.watch_leader(proc)
        proc.worker_busy_loop()
    except QueueShutdown:
        pass  # stop requested
    except Exception:
        traceback.print_exc()
        code = EXIT_STEP_FAILED
    proc.shutdown(engine_core_died=link.parent_died)
    # Leave without the interpreter's teardown: with a peer gone, destroying the gloo process
    # group blocked for over 5 s here (the executor's grace before SIGTERM).
    tracing.flush()  # os._exit skips the exit hooks that would write the trace
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
