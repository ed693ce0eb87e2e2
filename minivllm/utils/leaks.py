"""Find what a piece of code left behind: child processes, /dev/shm segments, ipc socket files.

The test suite's leak fixture and the judge both take a `Snapshot` before running code and
compare after. Everything found is reported and then cleaned up, so one leak does not
poison the next test.
"""

from __future__ import annotations

import os
import signal
import stat
import tempfile
import time
from dataclasses import dataclass, field

import psutil

SHM_DIR = "/dev/shm"
# Files the OS or Python keep in /dev/shm on their own (POSIX semaphores of multiprocessing).
_SHM_IGNORED_PREFIXES = ("sem.", "lost+found")
SOCKET_SCAN_DEPTH = 3  # ipc sockets live in private dirs under $TMPDIR; deeper is not ours


def shm_segments() -> set[str]:
    try:
        names = os.listdir(SHM_DIR)
    except FileNotFoundError:
        return set()
    return {n for n in names if not n.startswith(_SHM_IGNORED_PREFIXES)}


def ipc_socket_files(root: str | None = None, depth: int = SOCKET_SCAN_DEPTH) -> set[str]:
    """Unix socket files under root (default: the temp dir, where ipc:// endpoints are made),
    at most `depth` directories down."""
    root = root or tempfile.gettempdir()
    found: set[str] = set()
    base_depth = root.rstrip("/").count("/")
    for dirpath, dirnames, filenames in os.walk(root):
        if dirpath.count("/") - base_depth >= depth - 1:
            dirnames.clear()
        for name in filenames:
            path = os.path.join(dirpath, name)
            try:
                if stat.S_ISSOCK(os.lstat(path).st_mode):
                    found.add(path)
            except OSError:
                continue
    return found


def child_processes(pid: int | None = None) -> list[psutil.Process]:
    try:
        return psutil.Process(pid or os.getpid()).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


@dataclass
class Leaks:
    processes: list[str] = field(default_factory=list)
    segments: list[str] = field(default_factory=list)
    sockets: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.processes or self.segments or self.sockets)

    def describe(self) -> str:
        lines = [f"process left running: {p}" for p in self.processes]
        lines += [f"shared-memory segment left in /dev/shm: {s}" for s in self.segments]
        lines += [f"ipc socket file left behind: {s}" for s in self.sockets]
        return "\n".join(lines)


def describe_process(p: psutil.Process) -> str:
    try:
        return f"pid {p.pid} ({' '.join(p.cmdline())[:120] or p.name()})"
    except psutil.Error:
        return f"pid {p.pid}"


def kill_processes(procs: list[psutil.Process], grace: float = 1.0) -> None:
    """SIGTERM, wait `grace` seconds, then SIGKILL whatever is still alive."""
    for p in procs:
        try:
            p.send_signal(signal.SIGTERM)
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=grace)


def remove_paths(paths) -> None:
    for path in paths:
        try:
            os.unlink(path)
        except OSError:
            pass


class Snapshot:
    """What exists now; `leaks()` later tells what was added since, and cleans it up."""

    def __init__(self, socket_roots: list[tuple[str | None, int]] = ((None, SOCKET_SCAN_DEPTH),)):
        self.socket_roots = socket_roots  # (directory, depth) pairs to look for socket files in
        self.segments = shm_segments()
        self.sockets = self._sockets()
        self.children = {p.pid for p in child_processes()}

    def _sockets(self) -> set[str]:
        return set().union(*(ipc_socket_files(root, depth) for root, depth in self.socket_roots))

    def leaks(self, settle: float = 3.0, extra_processes: list[psutil.Process] = ()) -> Leaks:
        """Wait up to `settle` s for children to exit by themselves, then report and clean."""
        deadline = time.monotonic() + settle
        procs = [p for p in self._new_children() + list(extra_processes) if _alive(p)]
        while procs and time.monotonic() < deadline:
            time.sleep(0.05)
            procs = [p for p in procs if _alive(p)]
        found = Leaks(processes=[describe_process(p) for p in procs])
        kill_processes(procs)
        # Another program (a parallel test run) may own new files: skip what a live
        # process other than this one still maps or listens on. List the files first and
        # the holders second, so a file made during the scan is never taken for a leak.
        segments, sockets = shm_segments() - self.segments, self._sockets() - self.sockets
        others = _other_processes_holding()
        new_segments = sorted(s for s in segments if f"{SHM_DIR}/{s}" not in others)
        new_sockets = sorted(s for s in sockets if s not in others)
        found.segments, found.sockets = new_segments, new_sockets
        remove_paths(os.path.join(SHM_DIR, s) for s in new_segments)
        remove_paths(new_sockets)
        return found

    def _new_children(self) -> list[psutil.Process]:
        return [p for p in child_processes() if p.pid not in self.children]


def _socket_inodes(pid: str) -> set[str]:
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        pass
    return inodes


def _other_processes_holding() -> set[str]:
    """Paths of shm segments mapped, and unix sockets bound, by processes other than us."""
    me = str(os.getpid())
    held: set[str] = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or pid == me:
            continue
        try:
            with open(f"/proc/{pid}/maps") as f:
                held.update(line.split(None, 5)[5].strip() for line in f
                            if SHM_DIR in line and len(line.split(None, 5)) == 6)
        except OSError:
            continue
    mine = _socket_inodes(me)
    try:
        with open("/proc/net/unix") as f:
            next(f)
            for line in f:
                parts = line.split()
                if len(parts) >= 8 and parts[6] not in mine:
                    held.add(parts[7])
    except OSError:
        pass
    return held


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
