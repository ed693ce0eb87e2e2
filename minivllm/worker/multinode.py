"""A worker's part in multi-node tensor parallelism (vLLM: WorkerProc._init_message_queues,
WorkerProc._init_message_queues in vllm/v1/executor/multiproc_executor.py).

    leader node (node_rank 0)                         node 1 .. nnodes-1 (serve --headless)
    executor ─ ring (shm) ─> local ranks 0..L-1       ranks r*L .. r*L+L-1
             ─ XPUB tcp://master_addr:* ────────────> the same broadcast, as remote readers
             <─ reply ring (shm) ─ each local rank
             <─ SUB ─────────────────────────────────  XPUB tcp://<node's address>:* (replies)

Only the leader's ranks were handed the ring's Handle (through their spawn arguments); the
others have nothing but master_addr:master_port. So the process group comes first: every rank
joins it over TCP (gloo's rendezvous on the leader's rank 0), rank 0 broadcasts the Handle,
each rank attaches (shm if local, tcp if not) and creates its reply queue, and the reply
Handles are all-gathered; rank 0 hands the other nodes' ones to the executor through its ready
pipe. vLLM does the same with its own group (create_mq_broadcaster with an external writer
handle, create_single_reader_mq_broadcasters).
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

import torch.distributed as dist

from minivllm.distributed import parallel_state
from minivllm.distributed.peer_watch import PeerWatch
from minivllm.distributed.shm_broadcast import Handle, MessageQueue
from minivllm.engine.config import EngineConfig
from minivllm.executor.messages import RPCRequest
from minivllm.serial import MsgpackDecoder

if TYPE_CHECKING:
    from minivllm.worker.worker_proc import WorkerProc

logger = logging.getLogger(__name__)

# After the leader is gone, how long the busy loop has to leave on its own before the process
# exits anyway (it may be blocked in an all-reduce with a peer that will never answer).
LEADER_GONE_GRACE_S = 2.0
EXIT_LEADER_GONE = 0  # the leader's shutdown is how a headless node normally ends


def init_worker_queues(proc: "WorkerProc", config: EngineConfig,
                       broadcast_handle: Handle | None) -> Handle:
    """Join the group, get the ring's Handle from rank 0, attach, make the reply queue and
    exchange its Handle. Sets proc's queues and reply_handles; returns the ring's Handle."""
    from minivllm.worker.worker_proc import REPLY_CHUNK_BYTES, REPLY_CHUNKS, REPLY_SPIN_S
    local_ip = parallel_state.advertised_ip(config.master_addr)  # VLLM_HOST_IP
    proc.worker.init_distributed(local_ip)
    box = [broadcast_handle]
    dist.broadcast_object_list(box, src=0)  # pickle, inside the group only
    handle = box[0]
    proc.rpc_broadcast_mq = MessageQueue.create_from_handle(
        handle, proc.rank, decoder=MsgpackDecoder(RPCRequest))
    on_leader = proc.rank < config.local_world_size  # the executor reads from shm
    proc.worker_response_mq = MessageQueue(1, int(on_leader), REPLY_CHUNK_BYTES, REPLY_CHUNKS,
                                           connect_ip=local_ip, busy_loop_s=REPLY_SPIN_S)
    replies: list[Handle | None] = [None] * config.tensor_parallel_size
    dist.all_gather_object(replies, proc.worker_response_mq.export_handle())
    proc.reply_handles = {proc.rank: replies[proc.rank]}
    if proc.rank == 0:  # the executor gets the other nodes' handles from rank 0 alone
        proc.reply_handles.update({r: h for r, h in enumerate(replies)
                                   if r >= config.local_world_size})
    logger.info("worker %d: %s reader of the ring, replies on %s", proc.rank,
                "local" if handle.local_reader_ranks.count(proc.rank) else "remote",
                replies[proc.rank].remote_subscribe_addr or "shm")
    return handle


def watch_leader(proc: "WorkerProc") -> PeerWatch:
    """A worker on another node than its executor: when the ring's tcp connection drops (the
    leader exited, was killed, or its link went down: heartbeats), leave the loop, and exit
    after LEADER_GONE_GRACE_S if the loop is stuck (an all-reduce with a dead peer)."""
    def on_lost(_key: object, endpoint: str) -> None:
        logger.warning("worker %d: lost the leader's broadcast at %s: stopping", proc.rank,
                       endpoint)
        proc.wake_up()
        if not watch.stopped.wait(LEADER_GONE_GRACE_S):
            os._exit(EXIT_LEADER_GONE)

    watch = PeerWatch({"leader": proc.rpc_broadcast_mq.remote_socket}, on_lost,
                      name="watch-leader")
    proc.watches.append(watch)
    return watch
