"""The tensor-parallel group: which rank this process is, and the two collectives the model uses.

With one rank (the in-process engine, the model tests) nothing is initialized and every
collective returns its input: the model code is the same at TP=1 and TP=N. With N ranks each
worker process calls init_distributed_environment() once; torch.distributed then all-reduces
over gloo on CPU and over nccl on CUDA. vLLM keeps the same global group
(vllm/distributed/parallel_state.py: get_tp_group, tensor_model_parallel_all_reduce in
vllm/distributed/communication_op.py), but on CPU it all-reduces through its own
shared-memory kernel first and uses gloo only as the fallback
(CpuCommunicator.__init__ in vllm/distributed/device_communicators/cpu_communicator.py picks
_CPUSHMDistributed; CpuCommunicator.all_reduce uses it).
"""

from __future__ import annotations

import datetime
import os
import socket
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from minivllm import envs
# A rendezvous or collective that waits this long for a peer means the peer is gone, stuck,
# or was never started: gloo raises instead of hanging for its default 30 minutes. The
# default of --distributed-timeout-seconds (EngineConfig.distributed_timeout_seconds).
from minivllm.engine.config import DEFAULT_DISTRIBUTED_TIMEOUT_S as COLLECTIVE_TIMEOUT_S


@dataclass
class TPGroup:
    rank: int = 0
    world_size: int = 1
    comm_s: float = 0.0  # seconds spent in collectives since the last reset (for the breakdown)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum x over the ranks, in place; x itself at TP=1."""
        if self.world_size == 1:
            return x
        start = time.perf_counter()
        dist.all_reduce(x)
        self.comm_s += time.perf_counter() - start
        return x

    def gather(self, x: torch.Tensor, dst: int = 0) -> torch.Tensor | None:
        """Concatenate every rank's x along the last dim on rank dst; None on the others."""
        if self.world_size == 1:
            return x
        start = time.perf_counter()
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.world_size)] if self.rank == dst else None
        dist.gather(x, parts, dst=dst)
        self.comm_s += time.perf_counter() - start
        return torch.cat(parts, dim=-1) if parts is not None else None


_TP = TPGroup()


def get_tp_group() -> TPGroup:
    return _TP


def get_open_port() -> int:
    """A free TCP port on 127.0.0.1 for the group's rendezvous (vLLM:
    vllm/utils/network_utils.py (get_open_port))."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def local_ip_toward(address: str) -> str:
    """This host's address (IPv4 or IPv6, as `address`) on the route to `address` (no packet
    is sent: a UDP connect only asks the kernel's routing table)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect((address, 9))
        return s.getsockname()[0]


def advertised_ip(toward: str) -> str:
    """The address the other nodes reach this one at: VLLM_HOST_IP when set, else this host's
    address on the route to `toward`, the leader. vLLM's get_ip (vllm/utils/network_utils.py:52-91)
    falls back to the route to 8.8.8.8, then to 2001:4860:4860::8888, then 0.0.0.0: a route
    that a cluster without internet access may lack, where the route to the leader exists."""
    return envs.host_ip() or local_ip_toward(toward)


def interface_of(ip: str) -> str:
    """The network interface that holds `ip`: where gloo must listen for the other nodes."""
    import psutil
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.family in (socket.AF_INET, socket.AF_INET6) and a.address.split("%")[0] == ip
               for a in addrs):
            return name
    raise RuntimeError(f"no network interface holds {ip}: is the address right?")


def init_distributed_environment(rank: int, world_size: int, init_method: str,
                                 backend: str | None = None, local_ip: str | None = None,
                                 timeout_s: float = COLLECTIVE_TIMEOUT_S) -> TPGroup:
    """Join the group of world_size ranks (rank 0 hosts the rendezvous at init_method).
    Across nodes, local_ip is this node's address toward the master: gloo listens on its
    interface (otherwise gloo takes the hostname's address, often 127.0.0.1, which the other
    nodes cannot reach)."""
    global _TP
    if local_ip is not None:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", interface_of(local_ip))
    if world_size > 1:
        backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        try:
            dist.init_process_group(backend, init_method=init_method, rank=rank,
                                    world_size=world_size,
                                    timeout=datetime.timedelta(seconds=timeout_s))
        except (RuntimeError, dist.DistStoreError) as e:  # torch's rendezvous timeout
            raise TimeoutError(
                f"rank {rank}: the process group at {init_method} did not gather its "
                f"{world_size} ranks within {timeout_s:g} s (--distributed-timeout-seconds): "
                "start every node within that window, and check that this node reaches the "
                f"address ({type(e).__name__}: {str(e).splitlines()[0][:200]})") from e
    _TP = TPGroup(rank, world_size)
    return _TP


def destroy_distributed_environment() -> None:
    global _TP
    if dist.is_initialized():
        dist.destroy_process_group()
    _TP = TPGroup()
