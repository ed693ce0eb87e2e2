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
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import signal
import subprocess
import time

PREFIX = "mvn"  # every namespace name starts mvn-<owner pid>-
SUBNET = "10.77.0"  # /24, private (RFC 1918); host i is SUBNET.(i+1)
BASE_DIR = "/run/minivllm-netns"  # per-host TMPDIR mount points (tmpfs inside each host)
SHM_SIZE = "256m"  # a host's /dev/shm: the rings and the KV cache of one test's workers
KILL_GRACE_S = 3.0  # SIGTERM, then this long, then SIGKILL for processes left on a host
EXIT_TIMEOUT_S = 10.0  # an init sh exits as soon as its stdin closes
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


def netem_unavailable() -> str | None:
    """Why `tc qdisc ... netem` cannot delay a link here (None: it can)."""
    if unavailable() or shutil.which("tc") is None:
        return unavailable() or "the 'tc' command is missing (package iproute2)"
    with NetnsCluster(1) as c:
        r = c.sh(0, "tc qdisc add dev eth0 root netem delay 1ms")
    if r.returncode:
        return f"this kernel has no netem qdisc (sch_netem): {r.stderr.strip()}"
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and r.returncode:
        raise RuntimeError(f"ip {' '.join(args)} failed: {r.stderr.strip()}")
    return r


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

    def __init__(self, k: int) -> None:
        why = unavailable()
        if why:
            raise RuntimeError(f"NetnsCluster: {why}")
        if k < 1:
            raise ValueError(f"a cluster needs at least one host, got {k}")
        sweep_stale()
        self.name = f"{PREFIX}-{os.getpid()}-{next(_counter)}"
        self.switch = f"{self.name}-sw"
        self.hosts = [f"{self.name}-h{i}" for i in range(k)]
        self.addresses = [f"{SUBNET}.{i + 1}" for i in range(k)]
        self.base = os.path.join(BASE_DIR, self.name)
        self.tmpdirs = [os.path.join(self.base, f"h{i}") for i in range(k)]
        self._inits: list[subprocess.Popen] = []
        self._started: list[subprocess.Popen] = []
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
        for i, (host, addr) in enumerate(zip(self.hosts, self.addresses)):
            _ip("netns", "add", host)
            _ip("-n", sw, "link", "add", f"h{i}", "type", "veth", "peer", "name", "eth0",
                "netns", host)
            _ip("-n", sw, "link", "set", f"h{i}", "master", "br0", "up")
            _ip("-n", host, "addr", "add", f"{addr}/24", "dev", "eth0")
            _ip("-n", host, "link", "set", "eth0", "up")
            _ip("-n", host, "link", "set", "lo", "up")
            os.makedirs(self.tmpdirs[i], mode=0o700)
            self._inits.append(self._start_init(host, self.tmpdirs[i]))

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
        """Cut host i off the network (its veth end in the switch goes down)."""
        _ip("-n", self.switch, "link", "set", f"h{i}", "down")

    def delay(self, i: int, ms: float) -> None:
        """Delay every packet host i sends by ms (tc netem on its eth0)."""
        r = self.sh(i, f"tc qdisc replace dev eth0 root netem delay {ms}ms")
        if r.returncode:
            raise RuntimeError(f"tc netem on host {i} failed: {r.stderr.strip()}")

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
        for init in self._inits:
            if init.poll() is None:
                init.stdin.close()
                try:
                    init.wait(EXIT_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    init.kill()
                    init.wait()
            init.stdout.close()
        self._inits = []
        for name in self.hosts + [self.switch]:
            if os.path.exists(f"/run/netns/{name}"):
                _delete_netns(name)
        shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> "NetnsCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
