"""NetnsCluster: K "hosts" on one Linux machine, separated the way machines are.

    switch netns  mvn-<pid>-<n>-sw:  bridge br0 ── veth h0 ── h1 ── ... (one per host)
    host i netns  mvn-<pid>-<n>-h<i>: eth0 = 10.77.0.(i+1)/24, lo
                  + its own IPC namespace and mount namespace, holding a private tmpfs on
                    /dev/shm and one on the host's TMPDIR (where ipc:// socket files live)

A shared-memory segment or a Unix socket made on one host cannot be seen from another: the
only path between hosts is TCP/IP through the bridge. The rest of the file system (the repo,
the venv, the model files) stays shared, read like a cluster's shared model store.

Each host has one long-lived init process (`sh` holding the namespaces); `run(i, argv)`
starts a command on host i with nsenter into the init's net, IPC and mount namespaces, so
every process of one host shares its /dev/shm, as processes on one machine do. The bridge
lives in its own namespace: nothing is added to the machine's own network namespace, and
every address is reachable only from inside the cluster. Two clusters (two test runs at
once) use the same addresses without meeting, because each has its own switch.

Cleanup: close() kills whatever still runs in the hosts' namespaces and deletes the
namespaces (the veths and the bridge go with them; the tmpfs mounts die with their mount
namespaces). After a SIGKILL of the owner, the init processes exit (their stdin pipe reads
EOF), and the next cluster made on the machine sweeps the namespaces whose owner pid is dead.
Root is needed (`ip netns add`); `unavailable()` says why when it is not there.

A delayed link: NetnsCluster(k, delay_ms=D) delays everything each host sends by D, so a
round trip between two hosts gains 2 x D. With `tc qdisc ... netem` on each host's eth0 where
the kernel has sch_netem; otherwise each host's eth0 and its bridge port are TAP devices
joined by one userspace wire process (utils/netns_wire.py) that holds the frames a host
sends for D. `delay_by` says which one ran; set_delay() changes D while processes run. The
wire lives in the switch's namespace, ends with its owner (its stdin reads EOF) and is swept
with the switch.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

from minivllm.utils import netns_wire
from minivllm.utils.netns_wire import delay_method, tc

PREFIX = "mvn"  # every namespace name starts mvn-<owner pid>-
SUBNET = "10.77.0"  # /24, private (RFC 1918); host i is SUBNET.(i+1)
BASE_DIR = "/run/minivllm-netns"  # per-host TMPDIR mount points (tmpfs inside each host)
SHM_SIZE = "256m"  # a host's /dev/shm: the rings and the KV cache of one test's workers
KILL_GRACE_S = 3.0  # SIGTERM, then this long, then SIGKILL for processes left on a host
EXIT_TIMEOUT_S = 10.0  # an init sh (or the wire) exits as soon as its stdin closes
_counter = itertools.count()
_NAME_RE = re.compile(rf"^{PREFIX}-(\d+)-")


def unavailable() -> str | None:
    """Why a cluster cannot be made here (None: it can)."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add): run the suite as root"
    for tool in ("ip", "nsenter", "unshare", "mount"):
        if shutil.which(tool) is None:
            return f"the {tool!r} command is missing (package iproute2 / util-linux)"
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return netns_wire.run("ip", *args, check=check)


def _pids_in_netns(ns_path: str) -> list[int]:
    """Processes whose network namespace is the one bound at ns_path."""
    try:
        inode = os.stat(ns_path).st_ino
    except FileNotFoundError:
        return []
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.readlink(f"/proc/{entry}/ns/net") == f"net:[{inode}]":
                    pids.append(int(entry))
            except OSError:
                pass  # gone, or a kernel thread
    return pids


def _kill_all(pids: list[int], grace: float = KILL_GRACE_S) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while pids and time.monotonic() < deadline:
            pids = [p for p in pids if os.path.exists(f"/proc/{p}")
                    and _state(p) != "Z"]
            time.sleep(0.02)
        if not pids:
            return


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "X"


def _end(proc: subprocess.Popen) -> None:
    """End a process that exits when its stdin closes (an init, the wire)."""
    if proc.poll() is None:
        proc.stdin.close()
        try:
            proc.wait(EXIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    proc.stdout.close()


def _delete_netns(name: str) -> None:
    _kill_all(_pids_in_netns(f"/run/netns/{name}"))
    _ip("netns", "del", name, check=False)


def sweep_stale() -> list[str]:
    """Delete the namespaces (and mount-point folders) of clusters whose owner is dead."""
    swept = []
    names = os.listdir("/run/netns") if os.path.isdir("/run/netns") else []
    folders = os.listdir(BASE_DIR) if os.path.isdir(BASE_DIR) else []
    for name in names + folders:
        m = _NAME_RE.match(name)
        if m and not os.path.exists(f"/proc/{m.group(1)}"):
            if name in names:
                _delete_netns(name)
            else:
                shutil.rmtree(os.path.join(BASE_DIR, name), ignore_errors=True)
            swept.append(name)
    return swept


class NetnsCluster:
    """K hosts; use as a context manager (or call close()): everything made is removed."""

    def __init__(self, k: int, delay_ms: float = 0.0, delay_by: str | None = None) -> None:
        """k hosts; delay_ms > 0 delays what each host sends, by `delay_by`: "tc netem",
        "wire", or None for delay_method(). A delay_by given, even with delay_ms 0, makes the
        links ready for set_delay()."""
        why = unavailable()
        if why:
            raise RuntimeError(f"NetnsCluster: {why}")
        if k < 1:
            raise ValueError(f"a cluster needs at least one host, got {k}")
        if delay_ms < 0 or delay_by not in (None, "tc netem", "wire"):
            raise ValueError(f"delay_ms >= 0 and delay_by in (None, 'tc netem', 'wire'), "
                             f"got {delay_ms}, {delay_by!r}")
        sweep_stale()
        self.name = f"{PREFIX}-{os.getpid()}-{next(_counter)}"
        self.switch = f"{self.name}-sw"
        self.hosts = [f"{self.name}-h{i}" for i in range(k)]
        self.addresses = [f"{SUBNET}.{i + 1}" for i in range(k)]
        self.base = os.path.join(BASE_DIR, self.name)
        self.tmpdirs = [os.path.join(self.base, f"h{i}") for i in range(k)]
        self.delay_ms = delay_ms
        self.delay_by = delay_by
        self._inits: list[subprocess.Popen] = []
        self._started: list[subprocess.Popen] = []
        self._wire: subprocess.Popen | None = None
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def _build(self) -> None:
        sw = self.switch
        _ip("netns", "add", sw)
        _ip("-n", sw, "link", "add", "br0", "type", "bridge")
        _ip("-n", sw, "link", "set", "br0", "up")
        for host in self.hosts:
            _ip("netns", "add", host)
        if self.delay_ms and self.delay_by is None:
            self.delay_by = delay_method()
        if self.delay_by == "wire":
            self._wire = self._start_wire()
        for i, (host, addr) in enumerate(zip(self.hosts, self.addresses)):
            if not self._wire:
                _ip("-n", sw, "link", "add", f"h{i}", "type", "veth", "peer", "name", "eth0",
                    "netns", host)
            _ip("-n", sw, "link", "set", f"h{i}", "master", "br0", "up")
            _ip("-n", host, "addr", "add", f"{addr}/24", "dev", "eth0")
            _ip("-n", host, "link", "set", "eth0", "up")
            _ip("-n", host, "link", "set", "lo", "up")
            if self.delay_by == "tc netem":
                tc(host, "qdisc", "add", "dev", "eth0", "root", "netem", "delay",
                   f"{self.delay_ms:g}ms")
            os.makedirs(self.tmpdirs[i], mode=0o700)
            self._inits.append(self._start_init(host, self.tmpdirs[i]))

    def _start_wire(self) -> subprocess.Popen:
        """The wire process in the switch's netns, with a TAP pair per host."""
        why = netns_wire.unavailable()
        if why:
            raise RuntimeError(f"NetnsCluster: no netem and no wire for delay_ms: {why}")
        wire = subprocess.Popen(
            ["nsenter", f"--net=/run/netns/{self.switch}", sys.executable, "-m",
             "minivllm.utils.netns_wire", str(self.delay_ms),
             *[f"/run/netns/{h}" for h in self.hosts]],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self._wire = wire  # close() ends it if what follows fails
        if wire.stdout.readline().strip() != "ready":
            raise RuntimeError("the delay wire did not start (see its error above)")
        return wire

    def _start_init(self, host: str, tmpdir: str) -> subprocess.Popen:
        """sh in host's netns and its own IPC and mount namespaces, with the tmpfs mounted;
        it lives until its stdin (a pipe from this process) closes."""
        script = (f"mount -t tmpfs -o size={SHM_SIZE},mode=1777 tmpfs /dev/shm && "
                  f"mount -t tmpfs -o mode=0700 tmpfs {tmpdir} && echo ready && "
                  "read _ ; exit 0")
        init = subprocess.Popen(
            ["nsenter", f"--net=/run/netns/{host}", "unshare", "--ipc", "--mount",
             "--propagation", "private", "sh", "-c", script],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = init.stdout.readline()  # mount returns at once or fails: EOF, no hang
        if line.strip() != "ready":
            init.kill()
            init.wait()
            raise RuntimeError(f"host {host} did not start (mount failed: see stderr above)")
        return init

    # --- running things on a host --------------------------------------------------------
    def command(self, i: int, argv: list[str], env: dict[str, str] | None = None) -> list[str]:
        """argv wrapped to run on host i (its network, IPC and mount namespaces; its TMPDIR)."""
        env = dict(env or {})
        env.setdefault("TMPDIR", self.tmpdirs[i])
        return (["nsenter", "-t", str(self._inits[i].pid), "--net", "--ipc", "--mount",
                 f"--wd={os.getcwd()}", "env"] + [f"{k}={v}" for k, v in env.items()] + argv)

    def popen(self, i: int, argv: list[str], env: dict[str, str] | None = None,
              **kwargs) -> subprocess.Popen:
        """Start argv on host i; close() stops it if it still runs."""
        proc = subprocess.Popen(self.command(i, argv, env), **kwargs)
        self._started.append(proc)
        return proc

    def sh(self, i: int, script: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
        """Run a shell script on host i and wait for it."""
        return subprocess.run(self.command(i, ["sh", "-c", script]), capture_output=True,
                              text=True, timeout=timeout)

    def leftovers(self, i: int) -> list[str]:
        """What lies in host i's /dev/shm and TMPDIR (empty after a clean run)."""
        r = self.sh(i, f"ls -A /dev/shm {self.tmpdirs[i]}")
        return [x for x in r.stdout.split() if x and not x.endswith(":")]

    def processes(self, i: int) -> list[int]:
        """The pids that run on host i, its init excepted."""
        init = self._inits[i].pid if i < len(self._inits) else None
        return [p for p in _pids_in_netns(f"/run/netns/{self.hosts[i]}") if p != init]

    def stop_processes(self, i: int) -> None:
        """End everything that runs on host i (SIGTERM, KILL_GRACE_S, SIGKILL)."""
        _kill_all(self.processes(i))

    # --- the network ---------------------------------------------------------------------
    def link_down(self, i: int) -> None:
        """Cut host i off the network (its port on the switch, veth or TAP, goes down; the
        wire drops what a down TAP refuses)."""
        _ip("-n", self.switch, "link", "set", f"h{i}", "down")

    def set_delay(self, ms: float) -> None:
        """From now on, delay what every host sends by ms (a cluster made with delay_by)."""
        if self.delay_by == "tc netem":
            for host in self.hosts:
                tc(host, "qdisc", "replace", "dev", "eth0", "root", "netem", "delay", f"{ms:g}ms")
        elif self.delay_by == "wire":
            self._wire.stdin.write(f"{ms}\n")
            self._wire.stdin.flush()
            if self._wire.stdout.readline().split() != ["delay", f"{float(ms):g}"]:
                raise RuntimeError("the delay wire did not take the new delay (see above)")
        else:
            raise ValueError("this cluster's links are veths without netem: make it with "
                             "delay_by=netns_cluster.delay_method() to change its delay")
        self.delay_ms = ms

    def ping(self, i: int, j: int, count: int = 20) -> dict:
        """ICMP echo from host i to host j: {"rtt_ms": [...], "lost": n}."""
        r = self.sh(i, f"{sys.executable} -m minivllm.utils.icmp_ping {self.addresses[j]} "
                       f"{count}")
        if r.returncode:
            raise RuntimeError(f"ping from host {i} failed: {r.stderr.strip()}")
        return json.loads(r.stdout)

    # --- cleanup -------------------------------------------------------------------------
    def close(self) -> None:
        """Stop what runs on the hosts, delete the namespaces and folders. Idempotent."""
        for proc in self._started:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        for host in self.hosts:
            _kill_all([p for p in _pids_in_netns(f"/run/netns/{host}")
                       if p not in {init.pid for init in self._inits}])
        for proc in self._inits + ([self._wire] if self._wire else []):
            _end(proc)  # the wire's TAPs hold the namespaces: it ends before they go
        self._inits, self._wire = [], None
        for name in self.hosts + [self.switch]:
            if os.path.exists(f"/run/netns/{name}"):
                _delete_netns(name)
        shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> "NetnsCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
