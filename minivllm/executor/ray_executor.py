"""RayExecutor: MultiprocExecutor's data path, with Ray as the launch, placement and health
plane (vLLM: RayExecutorV2 in vllm/v1/executor/ray_executor_v2.py).

    Ray cluster: head + worker nodes        the engine core (a Ray driver on one node)
    placement group: one {"CPU": 1} bundle  ── ring (shm) ──> ranks on the driver's node
    per TP rank (PACK, as vLLM), or yours   ── XPUB tcp ────> ranks on the other nodes
    each rank: a RayWorker actor in its     <── replies: shm (driver's node) or tcp ──
    bundle, running WorkerProc              gloo over TCP, its TCPStore in rank 0
    health: ray.wait on each actor's run() reference, and PeerWatch on the tcp replies

What Ray does: find CPUs on the nodes, start one process per rank there, and say when one
ends. What it does not: carry a step's bytes; they take the ring and TCP exactly as with
`--nnodes` (worker/multinode.py). Where the cluster and the placement group come from:
ray_utils.py. The bundles are sorted as vLLM's, so the driver's node holds ranks 0..L-1;
every node must hold the same number L (minivllm's multi-node layout), where vLLM takes any.
"""

from __future__ import annotations

import copy
import logging
import os
import threading
import weakref
from typing import Any

from minivllm.distributed.parallel_state import get_open_port
from minivllm.executor.multiproc_executor import MultiprocExecutor, WorkerProcHandle
from minivllm.executor.ray_utils import (DEVICE_KEY, HOW_TO_START, bundles_sorted_by_node,
                                         current_placement_group, local_instance_args,
                                         rank_bundles)
from minivllm.utils.load_scale import stretched
from minivllm.utils.mp import STOP_GRACE_S
from minivllm.worker.worker_proc import unlink_queue_files

logger = logging.getLogger(__name__)

# hang checks, each stretched with the load as the judge's time limits are (utils/load_scale.py)
PLACEMENT_TIMEOUT_S = 60.0  # free CPUs are reserved in ms; longer means they are not there
START_TIMEOUT_S = 300.0  # every actor imported torch, joined the group, attached its queues
MONITOR_POLL_S = 1.0  # ray.wait's timeout: how soon the monitor sees a shutdown (vLLM: 5 s)


class RayWorker:
    """One TP rank inside a Ray actor (vLLM: RayWorkerProc). Two calls may run at once
    (max_concurrency=2): run() holds one thread for the busy loop, stop() wakes it."""

    def start(self, config: Any, rank: int, broadcast_handle: Any, init_method: str,
              engine_run_dir: str | None) -> dict:
        """Build the WorkerProc (it joins the group: every rank's start() runs at once). A
        rank on the driver's node keeps its ipc files in the engine's run folder, which the
        engine removes even if Ray kills this process first (utils/run_dir.py)."""
        from setproctitle import setproctitle

        from minivllm.utils.run_dir import RUN_DIR_ENV
        from minivllm.worker.worker_proc import WorkerProc, process_title
        if engine_run_dir:
            os.environ[RUN_DIR_ENV] = engine_run_dir
        setproctitle(process_title(rank, config.tensor_parallel_size))
        self.proc = WorkerProc(config, rank, broadcast_handle, init_method)
        return self.proc.reply_handles

    def run(self) -> int:
        """The busy loop until stop() or the leader's loss; what worker_main does."""
        from minivllm.distributed.shm_broadcast import QueueShutdown
        from minivllm.utils import run_dir
        from minivllm.worker import multinode
        try:
            self.proc.wait_until_ready()
            if self.proc.rpc_broadcast_mq.remote_socket is not None:
                multinode.watch_leader(self.proc)
            self.proc.worker_busy_loop()
        except QueueShutdown:
            pass
        finally:
            self.proc.shutdown(engine_core_died=False)
            run_dir.remove_at_exit()  # ray.kill ends the process next: no exit hooks run
        return 0

    def stop(self) -> None:
        self.proc.wake_up()


def ray_layout(pg: Any, world_size: int) -> tuple[list[int], list[str], int]:
    """The bundle index of each rank (vLLM's order: the driver's node first), the address of
    each rank's node, and the ranks per node; ValueError unless every node holds as many
    ranks as the driver's (minivllm's multi-node layout; vLLM also takes uneven ones)."""
    import ray
    driver = ray.get_runtime_context().get_node_id()
    placed = bundles_sorted_by_node(pg, rank_bundles(pg, world_size), driver)[:world_size]
    ip = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
    nodes = [node for _, node in placed]
    counts = {ip.get(n, n): nodes.count(n) for n in nodes}
    if nodes[0] != driver or len(set(counts.values())) > 1:
        raise ValueError(f"Ray placed the TP ranks as {counts} (node: ranks), the driver on "
                         f"{ip.get(driver, driver)}: minivllm needs the driver's node to hold "
                         "ranks and every node as many; give each node the same --num-cpus "
                         "(or a placement group with as many bundles on each node)")
    return [b for b, _ in placed], [ip.get(n, "?") for n in nodes], nodes.count(driver)


class RayExecutor(MultiprocExecutor):
    def _init_executor(self) -> None:
        import ray
        self._ray_owner = not ray.is_initialized()  # ray.shutdown() at the end only if so
        if self._ray_owner:  # address None: ray.init's default (ray_utils.py's docstring);
            # a local instance starts without Ray's dashboard (vLLM keeps Ray's default)
            ray.init(address=self.config.ray_address, include_dashboard=False,
                     logging_level=logging.WARNING, **local_instance_args(self.config.ray_address))
        self._monitor: threading.Thread | None = None
        self.actors: list[Any] = []
        self.run_refs: list[Any] = []
        self.pg, self._pg_owner = None, False  # _release removes the group only if ours
        self._take_placement_group()
        tp = self.config.tensor_parallel_size
        try:
            self.bundles, self.node_ips, local = ray_layout(self.pg, tp)
        except ValueError:
            self._release()
            raise
        # the workers see a multi-node layout: nnodes nodes of `local` ranks, met at this node
        config = copy.copy(self.config)
        config.nnodes, config.node_rank = tp // local, 0
        config.master_addr = ray.util.get_node_ip_address()
        config.master_port = get_open_port()
        self.config = config
        logger.info("ray: %d ranks on %d node(s), %d per node, cluster %s", tp, config.nnodes,
                    local, ray.get_runtime_context().gcs_address)
        super()._init_executor()

    def _take_placement_group(self) -> None:
        """The config's placement group, else this actor's, else a new one (PACK, one
        {"CPU": 1} bundle per rank, as vLLM's), once it is ready."""
        import ray
        from ray.util import placement_group
        tp = self.config.tensor_parallel_size
        self.pg = self.config.placement_group or current_placement_group()
        if self.pg is None:
            cpus = ray.cluster_resources().get(DEVICE_KEY, 0)
            if cpus < tp:  # vLLM waits for the cluster to grow; minivllm says so at once
                self._release()
                raise RuntimeError(f"the Ray cluster has {cpus:g} CPUs in all, "
                                   f"tensor_parallel_size={tp} needs {tp}: add nodes or CPUs;"
                                   f" {HOW_TO_START}")
            self.pg = placement_group([{DEVICE_KEY: 1}] * tp, strategy="PACK")
            self._pg_owner = True
        limit = stretched(PLACEMENT_TIMEOUT_S)
        try:
            ray.get(self.pg.ready(), timeout=limit)
        except ray.exceptions.GetTimeoutError:
            specs = self.pg.bundle_specs
            self._release()
            raise RuntimeError(f"Ray could not place the bundles {specs} within "
                               f"{limit:.0f} s (free: {ray.available_resources()})"
                               ": other jobs hold the CPUs (`ray status`)") from None

    def _start_workers(self) -> None:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
        from minivllm.distributed.shm_broadcast import MessageQueue
        from minivllm.executor.messages import RPCResponse
        from minivllm.serial import MsgpackDecoder
        from minivllm.utils.run_dir import run_dir
        from minivllm.worker.worker_proc import READY_TIMEOUT_S
        remote_worker = ray.remote(RayWorker)
        for bundle in self.bundles:
            strategy = PlacementGroupSchedulingStrategy(
                placement_group=self.pg, placement_group_bundle_index=bundle)
            self.actors.append(remote_worker.options(
                num_cpus=1, max_concurrency=2, scheduling_strategy=strategy).remote())
        c = self.config
        init_method = f"tcp://{c.master_addr}:{c.master_port}"
        handle = self.rpc_broadcast_mq.export_handle()
        local = [rank < c.local_world_size for rank in range(self.world_size)]
        refs = [a.start.remote(c, rank, handle if local[rank] else None, init_method,
                               run_dir() if local[rank] else None)
                for rank, a in enumerate(self.actors)]
        handles: dict[int, Any] = {}
        for ready in ray.get(refs, timeout=stretched(START_TIMEOUT_S)):
            handles.update(ready)
        decoder = MsgpackDecoder(RPCResponse)
        for rank in range(self.world_size):
            mq = MessageQueue.create_from_handle(handles[rank], 0, decoder=decoder)
            self.workers.append(WorkerProcHandle(rank, None, handles[rank], mq))
        self.run_refs = [a.run.remote() for a in self.actors]
        self.rpc_broadcast_mq.wait_until_ready(stretched(READY_TIMEOUT_S))
        for w in self.workers:
            w.response_mq.wait_until_ready(stretched(READY_TIMEOUT_S))

    def _who(self, rank: int) -> str:
        return f"{rank} (Ray actor on {self.node_ips[rank]})"

    def _start_worker_monitor(self) -> None:
        """A rank's run() reference resolves only when its actor ends: ray.wait on all of
        them is Ray's sentinel (vLLM: RayExecutorV2.start_worker_monitor)."""
        import ray
        self_ref, refs = weakref.ref(self), list(self.run_refs)

        def monitor_workers() -> None:
            while True:
                done, _ = ray.wait(refs, num_returns=1, timeout=MONITOR_POLL_S)
                executor = self_ref()
                if executor is None or executor.shutting_down:
                    return
                if done:
                    rank = refs.index(done[0])
                    executor._on_worker_death(executor.workers[rank], _how_it_ended(done[0]))
                    return

        self._monitor = threading.Thread(target=monitor_workers, daemon=True,
                                         name="RayWorkerMonitor")
        self._monitor.start()

    def _on_worker_death(self, dead: WorkerProcHandle, how: str | None = None) -> None:
        """As MultiprocExecutor's, but every rank's ring names go first: ray.kill (or the
        driver's exit) ends the survivors too, with no chance to remove their own."""
        for w in self.workers:
            unlink_queue_files(w.response_handle)
        super()._on_worker_death(dead, how)

    def _stop_workers(self) -> None:
        """Ask every actor to stop, wait STOP_GRACE_S for their run() to return, then
        ray.kill them all and remove what a killed one left. Idempotent."""
        import ray
        with self._stop_lock:
            if self._stopped:
                return
            self._stopped = True
            for actor in self.actors:
                actor.stop.remote()
            if self.run_refs:
                ray.wait(self.run_refs, num_returns=len(self.run_refs), timeout=STOP_GRACE_S)
            for actor in self.actors:
                ray.kill(actor)
            for w in self.workers:
                unlink_queue_files(w.response_handle)

    def shutdown(self) -> None:
        if self.shutting_down:
            return
        super().shutdown()
        if self._monitor is not None and self._monitor is not threading.current_thread():
            self._monitor.join(MONITOR_POLL_S * 5)  # out of ray.wait before Ray goes
        self._release()

    def _release(self) -> None:
        """Remove the placement group if this executor made it (one it was given stays),
        and leave Ray if this executor joined or started it."""
        import ray
        from ray.util import remove_placement_group
        if ray.is_initialized():
            if self._pg_owner:
                remove_placement_group(self.pg)
                self._pg_owner = False
            if self._ray_owner:
                ray.shutdown()


def _how_it_ended(ref: Any) -> str:
    import ray
    try:
        ray.get(ref)
    except ray.exceptions.RayError as e:
        return f"died ({type(e).__name__}: {str(e).strip().splitlines()[0]})"
    return "left its loop (the ring was shut down)"
