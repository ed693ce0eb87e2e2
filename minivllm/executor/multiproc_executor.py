"""MultiprocExecutor: the engine core's side of N worker processes (vLLM's
vllm/v1/executor/multiproc_executor.py (MultiprocExecutor)).

    engine core process                                  worker processes (WorkerProc)
    MultiprocExecutor ──rpc_broadcast_mq (1 writer, N readers, shm ring)──> rank 0 .. N-1
                      <──response_mqs[r]: MessageQueue(1, 1), created by rank r──
                      ── ready pipe / death pipe per worker (utils/mp.launch) ──
                      monitor thread: wait(sentinels)

- One broadcast queue carries every call (vLLM: MultiprocExecutor._init_executor); each worker
  creates its own reply queue and sends its handle through the ready pipe
  (WorkerProc._init_message_queues, WorkerProc.worker_main).
- execute_model waits for the output rank's reply only (MultiprocExecutor.execute_model and
  collective_rpc's unique_reply_rank); collective_rpc
  waits for every rank, with one deadline for the whole call, and names the rank that failed.
- A monitor thread waits on the workers' sentinels (MultiprocExecutor.start_worker_monitor).
  When one dies, it first fails
  every pending wait (shuts the queues down), then calls the failure callback (the engine core
  reports itself dead), and only then stops the other workers. vLLM shuts down first (which
  waits up to VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS, then 4 s after SIGTERM) and calls back
  after, so its caller can wait ~9 s to hear of the death.
- shutdown() escalates for all workers at once (MultiprocExecutor.shutdown): ask (b"stop" on the death pipes),
  wait, SIGTERM, wait, SIGKILL; then it unlinks by name the reply rings and ipc files of
  workers that were killed before they could.
- Across nodes (nnodes > 1, as MultiprocExecutor._init_executor does): this node's ranks read the ring from shm, the other
  nodes' ranks read it over tcp (remote readers) and reply over tcp; their workers are started
  by `minivllm serve --headless` there (executor/multinode.py), so the executor has no
  sentinel for them: a PeerWatch on their reply connections reports their death.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import multiprocessing.connection
import os
import signal
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any

from minivllm import envs
from minivllm.distributed.parallel_state import advertised_ip
from minivllm.distributed.peer_watch import PeerWatch
from minivllm.distributed.shm_broadcast import Handle, MessageQueue, QueueShutdown
from minivllm.distributed.spin_condition import BUSY_LOOP_S
from minivllm.engine.scheduler_output import ModelRunnerOutput, SchedulerOutput
from minivllm.executor.abstract import Executor, FailureCallback
from minivllm.executor.messages import ExecuteModel, RPCCall, RPCError, RPCResponse
from minivllm.serial import MsgpackDecoder
from minivllm.executor.multinode import start_node_workers
from minivllm.executor.proc_group import stop_all
from minivllm.utils import tracing
from minivllm.utils.mp import ProcHandle
from minivllm.worker.worker_proc import READY_TIMEOUT_S, unlink_queue_files

logger = logging.getLogger(__name__)

INIT_TIMEOUT_S = 300.0  # init_device + load_model on every rank; 3 ranks on 2 cores are slow
# Workers spin on the broadcast ring this long after each step before they sleep in poll.
# With more ranks than cores a spinning rank takes the core the engine core needs to schedule
# the next step, so the window shrinks to what covers the gap between two steps.
OVERSUBSCRIBED_SPIN_S = 0.002
# After a failed step, how long to look for a dead peer before blaming the rank that replied.
DEATH_GRACE_S = 1.0
# Once a peer is known dead, how long the monitor thread may take to record it (a loaded
# machine: the whole wait is spent only when a worker really died).
FAILURE_RECORD_S = 10.0


class WorkerDiedError(RuntimeError):
    """A worker process died: the executor cannot run another step."""


@dataclass
class WorkerProcHandle:
    rank: int
    proc: ProcHandle | None  # None: the worker runs on another node (no sentinel, no pipes)
    response_handle: Handle
    response_mq: MessageQueue


@dataclass
class StepBreakdown:
    """Where one execute_model call's time went, in seconds (the output rank's view)."""
    broadcast: float  # enqueue start -> the output rank has the step
    forward: float  # the model, collectives excluded
    collective: float  # all-reduce and gather
    reply: float  # the output rank enqueues -> the executor has the reply
    total: float


class MultiprocExecutor(Executor):
    def _init_executor(self) -> None:
        if self.config.node_rank_within_dp != 0:
            raise ValueError("the executor runs on the leader (node_rank 0); the other nodes "
                             "run their workers with `minivllm serve --headless`")
        self.world_size = self.config.tensor_parallel_size
        self.local_world_size = self.config.local_world_size
        self.remote_watch: PeerWatch | None = None
        self.output_rank = 0  # the rank whose reply execute_model waits for (vLLM: output_rank)
        self.workers: list[WorkerProcHandle] = []
        self.failure_callback: FailureCallback | None = None
        self.failed, self.failure = threading.Event(), ""  # set once failure is written
        self.shutting_down = False
        self.last_step: StepBreakdown | None = None
        self._call_ids = itertools.count()
        self._stop_lock = threading.Lock()
        self._stopped = False
        self._fail_lock = threading.Lock()
        oversubscribed = self.local_world_size >= len(os.sched_getaffinity(0))
        # the ring: shm for this node's ranks, tcp for the other nodes' at VLLM_HOST_IP, or
        # else this node's address toward master_addr (vLLM passes get_ip(): :163-184)
        self.rpc_broadcast_mq = MessageQueue(
            self.world_size, self.local_world_size,
            connect_ip=(advertised_ip(self.config.master_addr)
                        if self.config.nnodes_within_dp > 1 else None),
            busy_loop_s=OVERSUBSCRIBED_SPIN_S if oversubscribed else BUSY_LOOP_S)
        # At exit, stop the workers before utils/mp's own exit hook does (atexit runs the
        # last registered first), so the monitor does not take their exit for a death.
        self_ref = weakref.ref(self)
        atexit.register(lambda: self_ref() is not None and self_ref().shutdown())
        try:
            self._start_workers()
            self._start_worker_monitor()
            self._watch_remote_workers()
            self.collective_rpc("init_device", timeout=INIT_TIMEOUT_S)
            self.collective_rpc("load_model", timeout=INIT_TIMEOUT_S)
        except BaseException:
            self.shutdown()
            raise

    def _start_workers(self) -> None:
        procs = start_node_workers(self.config, self.rpc_broadcast_mq.export_handle())
        handles = {rank: h for proc in procs for rank, h in proc.ready_message.items()}
        decoder = MsgpackDecoder(RPCResponse)
        for rank in range(self.world_size):  # the other nodes' reply queues are read over tcp
            mq = MessageQueue.create_from_handle(handles[rank], 0, decoder=decoder)
            proc = procs[rank] if rank < self.local_world_size else None
            self.workers.append(WorkerProcHandle(rank, proc, handles[rank], mq))
        self.rpc_broadcast_mq.wait_until_ready(READY_TIMEOUT_S)
        for w in self.workers:
            w.response_mq.wait_until_ready(READY_TIMEOUT_S)

    # --- calls ---------------------------------------------------------------------------
    def collective_rpc(self, method: str, args: tuple = (), kwargs: dict | None = None,
                       timeout: float | None = None, unique_reply_rank: int | None = None
                       ) -> list[Any]:
        """worker.<method>(*args, **kwargs) on every rank; the results by rank (only
        unique_reply_rank's, in a list of one, when given). One deadline for the whole call."""
        deadline = None if timeout is None else time.monotonic() + timeout
        call = RPCCall(next(self._call_ids), method, list(args), kwargs or {}, unique_reply_rank)
        self._broadcast(call, deadline, method)
        ranks = range(self.world_size) if unique_reply_rank is None else [unique_reply_rank]
        replies = [self._wait_reply(r, call.call_id, deadline, method, timeout) for r in ranks]
        for reply in replies:
            if isinstance(reply, RPCError):
                raise RuntimeError(f"collective_rpc({method!r}) failed on worker "
                                   f"{self._who(reply.rank)}:\n{reply.error}")
        return [reply.result for reply in replies]

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        start = time.perf_counter()
        timeout = envs.execute_model_timeout_s()  # VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS
        deadline = time.monotonic() + timeout
        call = ExecuteModel(next(self._call_ids), self.output_rank, scheduler_output)
        with tracing.span("broadcast"):
            self._broadcast(call, deadline, "execute_model")
        with tracing.span("wait_reply"):
            reply = self._wait_reply(self.output_rank, call.call_id, deadline,
                                     "execute_model", timeout)
        end = time.perf_counter()
        if isinstance(reply, RPCError):
            self._raise_if_a_worker_died(reply)
            raise RuntimeError(f"execute_model failed on worker {self._who(reply.rank)}:\n"
                               f"{reply.error}")
        t = reply.timing
        self.last_step = StepBreakdown(t.received - start, t.forward_s - t.collective_s,
                                       t.collective_s, end - t.sent, end - start)
        return reply.output

    def _broadcast(self, message: Any, deadline: float | None, what: str) -> None:
        self._check_alive(what)
        try:
            self.rpc_broadcast_mq.enqueue(message, _remaining(deadline))
        except QueueShutdown:
            raise self._died(what) from None

    def _wait_reply(self, rank: int, call_id: int, deadline: float | None, what: str,
                    timeout: float | None) -> Any:
        mq = self.workers[rank].response_mq
        while True:
            try:
                reply = mq.dequeue(_remaining(deadline))
            except TimeoutError:
                env = f", {envs.EXECUTE_MODEL_TIMEOUT_ENV}" if what == "execute_model" else ""
                raise TimeoutError(f"{what}: worker {self._who(rank)} did not reply within "
                                   f"{timeout:g} s (the deadline of the whole call{env}): it "
                                   "is stuck or very slow; see its log above") from None
            except QueueShutdown:
                raise self._died(what) from None
            if reply.call_id == call_id:
                return reply
            # a late reply to an earlier call whose caller timed out: not ours, drop it

    def _raise_if_a_worker_died(self, reply: RPCError) -> None:
        """A peer's death often reaches the output rank first, as a failed all-reduce: blame
        the dead worker, not the rank that noticed."""
        # Sentinels, not is_alive(): the monitor thread reaps the dead worker, and a waitpid
        # that loses that race reports "alive" (ECHILD), which blamed the rank that noticed.
        sentinels = [w.proc.sentinel for w in self.workers if w.proc is not None]
        if multiprocessing.connection.wait(sentinels, DEATH_GRACE_S):  # one is dead, or dies
            self.failed.wait(FAILURE_RECORD_S)  # the monitor thread is writing self.failure
        if self.failed.is_set():
            last = reply.error.strip().splitlines()[-1]
            raise WorkerDiedError(f"execute_model: {self.failure}\n(worker {reply.rank} then "
                                  f"failed with: {last})")

    def _check_alive(self, what: str) -> None:
        if self.failed.is_set() or self.shutting_down:
            raise self._died(what)

    def _died(self, what: str) -> WorkerDiedError:
        """The error every call gets once a worker died or the executor was shut down."""
        return WorkerDiedError(f"{what}: {self.failure or 'the executor was shut down'}")

    def _who(self, rank: int) -> str:
        proc = self.workers[rank].proc
        if proc is None:
            return f"{rank} (on node {rank // self.local_world_size})"
        return f"{rank} (pid {proc.pid})"

    # --- failures ------------------------------------------------------------------------
    def register_failure_callback(self, callback: FailureCallback) -> None:
        if self.failed.is_set():
            callback()
        else:
            self.failure_callback = callback

    def _start_worker_monitor(self) -> None:
        self_ref = weakref.ref(self)
        workers = [w for w in self.workers if w.proc is not None]

        def monitor_workers() -> None:
            by_sentinel = {w.proc.sentinel: w for w in workers}
            died = multiprocessing.connection.wait(list(by_sentinel))
            executor = self_ref()
            if executor is not None and not executor.shutting_down:
                executor._on_worker_death(by_sentinel[died[0]])

        threading.Thread(target=monitor_workers, daemon=True, name="MultiprocWorkerMonitor").start()

    def _watch_remote_workers(self) -> None:
        """The other nodes' workers: no sentinel crosses machines, their reply connections
        do (distributed/peer_watch.py: a dead process within ms, a cut link within the
        heartbeat timeout)."""
        remote = {w.rank: w.response_mq.remote_socket for w in self.workers
                  if w.response_mq.remote_socket is not None}
        if not remote:
            return
        self_ref = weakref.ref(self)

        def on_lost(rank: int, endpoint: str) -> None:
            executor = self_ref()
            if executor is not None and not executor.shutting_down:
                executor._on_worker_death(executor.workers[rank], f"is lost: {endpoint} "
                                          "closed or fell silent (process or link gone)")

        self.remote_watch = PeerWatch(remote, on_lost, name="RemoteWorkerWatch")

    def _on_worker_death(self, dead: WorkerProcHandle, how: str | None = None) -> None:
        with self._fail_lock:  # the sentinels and the remote watch: the first one reports
            if self.failed.is_set():
                return
            if how is None:
                code = dead.proc.exit_code(timeout=1.0)
                how = ("died (" + (f"signal {signal.Signals(-code).name}" if code and code < 0
                                   else f"exit code {code}") + ")")
            self.failure = (f"worker {self._who(dead.rank)} {how}; the engine cannot run "
                            "another step. See the worker's log")
            self.failed.set()
        logger.error(self.failure)
        # 0. the names of the dead worker's ring and ipc files, and of the broadcast queue's
        #    (no one attaches to a failed executor; mappings and sockets stay usable until
        #    close): a few syscalls, done before anything can end this process (an engine
        #    core may exit as soon as its wait fails, without shutting its executor down)
        unlink_queue_files(dead.response_handle)
        unlink_queue_files(self.rpc_broadcast_mq.handle)
        # 1. nobody stays blocked: every pending enqueue and dequeue raises QueueShutdown
        self.rpc_broadcast_mq.shutdown()
        for w in self.workers:
            w.response_mq.shutdown()
        # 2. tell the engine core (it reports itself dead to its clients)
        callback, self.failure_callback = self.failure_callback, None
        if callback is not None:
            callback()
        # 3. only now the slow part: stop the survivors, remove what the dead one left
        self._stop_workers()

    # --- shutdown ------------------------------------------------------------------------
    def _stop_workers(self) -> None:
        """Ask, wait, SIGTERM, wait, SIGKILL, for all workers at once; then unlink the
        rings and ipc files of any that died before removing their own. Idempotent."""
        with self._stop_lock:
            if self._stopped:
                return
            self._stopped = True
            stop_all([w.proc for w in self.workers if w.proc is not None])
            for w in self.workers:
                unlink_queue_files(w.response_handle)

    def shutdown(self) -> None:
        """Stop the workers and close the queues. Idempotent."""
        if self.shutting_down:
            return
        self.shutting_down = True
        if self.remote_watch is not None:  # before the sockets it watches are closed
            self.remote_watch.stop()
        self.rpc_broadcast_mq.shutdown()
        for w in self.workers:
            w.response_mq.shutdown()
        self._stop_workers()
        for w in self.workers:
            w.response_mq.close()
        self.rpc_broadcast_mq.close()


def _remaining(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())
