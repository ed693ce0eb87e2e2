"""Chapter 10's experiments: what crossing the host's edge costs and how a remote death shows.

Hosts(k) is K network-namespace hosts (utils/netns_cluster.py: separate network, IPC and
/dev/shm, joined by a bridge) when this process may build them (root), and otherwise K
loopback "nodes": the same processes, flags and sockets (tcp, remote readers, gloo at the
master's address), all on 127.0.0.1 of this machine. Loopback nodes take the multi-node code
path but are not separated: say so next to their numbers (Hosts.describe()).

Every process runs on a host through Hosts.popen, its stderr sent to the Hosts' log file.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from minivllm.distributed.parallel_state import get_open_port
from minivllm.utils import netns_cluster
from minivllm.utils.netns_cluster import NetnsCluster

PROCS = [sys.executable, "-m", "minivllm.bench._cross_host_procs"]
NETNS_PORT = 29501  # a namespace cluster has its own network: no other program holds it
RUN_TIMEOUT_S = 300.0


class Hosts:
    """K hosts to start processes on; a context manager that stops and removes everything."""

    def __init__(self, k: int, log_path: str | None = None) -> None:
        self.why_not_separate = netns_cluster.unavailable()
        self.cluster = NetnsCluster(k) if self.why_not_separate is None else None
        self.separate = self.cluster is not None
        self.addresses = self.cluster.addresses if self.cluster else ["127.0.0.1"] * k
        self.log = open(log_path, "a") if log_path else None
        self._started: list[subprocess.Popen] = []

    def describe(self) -> str:
        k = len(self.addresses)
        if self.separate:
            return (f"{k} hosts made of network namespaces ({', '.join(self.addresses)}): "
                    "each its own network stack, IPC and /dev/shm, joined by veths and a bridge")
        return (f"{k} loopback 'nodes' on 127.0.0.1 ({self.why_not_separate}): the multi-node "
                "code path over tcp, but one network stack and one /dev/shm")

    def port(self) -> int:
        """A port for a rendezvous at addresses[0]."""
        return NETNS_PORT if self.separate else get_open_port()

    def popen(self, i: int, argv: list[str], **kwargs) -> subprocess.Popen:
        kwargs.setdefault("stderr", self.log)
        if self.cluster is not None:
            return self.cluster.popen(i, argv, **kwargs)
        proc = subprocess.Popen(argv, **kwargs)
        self._started.append(proc)
        return proc

    def cut_off(self, i: int, proc: subprocess.Popen) -> str:
        """Make host i fall silent without closing anything: its link goes down (namespace
        hosts), or, on loopback, its process is stopped (SIGSTOP: no FIN, no heartbeat
        answer, the same silence). Returns what was done."""
        if self.cluster is not None:
            self.cluster.link_down(i)
            return f"ip link set h{i} down (host {i}'s cable pulled)"
        os.kill(proc.pid, signal.SIGSTOP)
        return "SIGSTOP of the remote process (not root: no link to cut; it falls silent)"

    def close(self) -> None:
        for proc in self._started:
            if proc.poll() is None:
                proc.kill()  # a stopped process dies of SIGKILL too
            proc.wait()
        if self.cluster is not None:
            self.cluster.close()
        if self.log is not None:
            self.log.close()

    def __enter__(self) -> "Hosts":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def all_reduce_times(h: Hosts, rank_hosts: list[int], sizes: list[int], reps: int
                     ) -> dict[int, float]:
    """Median seconds of one gloo all-reduce per float32 count, rank r on host rank_hosts[r]."""
    init = f"tcp://{h.addresses[rank_hosts[0]]}:{h.port()}"
    procs = [h.popen(i, PROCS + ["all_reduce", str(r), str(len(rank_hosts)), init,
                                 h.addresses[i], json.dumps(sizes), str(reps)],
                     stdout=subprocess.PIPE, text=True) for r, i in enumerate(rank_hosts)]
    outs = [p.communicate(timeout=RUN_TIMEOUT_S)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError(f"an all-reduce rank failed: exit codes {[p.returncode for p in procs]}"
                           " (its log: the Hosts' log file)")
    return {int(k): v for k, v in json.loads(outs[0].splitlines()[-1]).items()}


def remote_death(h: Hosts, fault: str) -> dict:
    """A remote worker's reply queue on host 1, watched from host 0 as the executor watches
    it; then the fault ("kill" = kill -9 of the worker, "cut" = Hosts.cut_off of host 1).
    Returns {"fault", "how", "detected_after_s"} (None if the watch heard nothing)."""
    if fault not in ("kill", "cut"):
        raise ValueError(f"fault is 'kill' or 'cut', got {fault!r}")
    worker = h.popen(1, PROCS + ["reply_writer", h.addresses[1]], stdout=subprocess.PIPE,
                     text=True)
    handle = worker.stdout.readline().strip()
    if not handle:
        raise RuntimeError("the remote worker printed no handle (see the Hosts' log file)")
    watch = h.popen(0, PROCS + ["watcher", handle], stdout=subprocess.PIPE, text=True)
    if watch.stdout.readline().strip() != "watching":
        raise RuntimeError("the watcher did not start (see the Hosts' log file)")
    time.sleep(0.5)  # a few quiet heartbeats first: a live, idle peer is not taken for dead
    if fault == "kill":
        how, fault_at = "kill -9 of the remote worker", time.time()
        worker.kill()
    else:
        fault_at = time.time()
        how = h.cut_off(1, worker)
    lost_at = json.loads(watch.communicate(timeout=RUN_TIMEOUT_S)[0].splitlines()[-1])["lost_at"]
    if worker.poll() is None:
        worker.kill()
    worker.wait()
    return {"fault": fault, "how": how,
            "detected_after_s": None if lost_at is None else lost_at - fault_at}
