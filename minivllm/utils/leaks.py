"""Find what a piece of code left behind: processes, /dev/shm segments, ipc socket files.

The test suite's leak fixture and the judge both take a `Snapshot` before running code and
compare after. They blame only what the code under test made, because other programs on the
machine (a second test run, a notebook) create segments and sockets at the same time:

- a process is ours if it descends from this one (the caller is a child subreaper, so even a
  process that double-forked and called setsid comes back to it);
- a segment or socket file is ours if its name carries the test's prefix (resource_names), if
  it lies in the test's private directory, or if a process of ours maps or binds it.

What is ours is reported and removed. Anything else that appeared is only named as a warning,
and never deleted.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import stat
import tempfile
import time
from dataclasses import dataclass, field

import psutil

from minivllm.utils.resource_names import has_prefix, resource_prefix
from minivllm.utils.runtime_shm import owner_pid

SHM_DIR = "/dev/shm"
# Files the OS or Python keep in /dev/shm on their own (POSIX semaphores of multiprocessing).
_SHM_IGNORED_PREFIXES = ("sem.", "lost+found")
SOCKET_SCAN_DEPTH = 1  # /tmp/x.sock (a hard-coded path); /tmp/dir/ is some program's own
PRIVATE_SCAN_DEPTH = 8  # inside a private dir everything is ours
PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h


def become_subreaper() -> bool:
    """Make orphaned descendants re-parent to this process instead of init (Linux)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def shm_segments() -> set[str]:
    try:
        names = os.listdir(SHM_DIR)
    except FileNotFoundError:
        return set()
    return {n for n in names if not n.startswith(_SHM_IGNORED_PREFIXES)}


def ipc_socket_files(root: str | None = None, depth: int = SOCKET_SCAN_DEPTH) -> set[str]:
    """Unix socket files under root (default: the temp dir), at most `depth` levels down."""
    root = (root or tempfile.gettempdir()).rstrip("/")
    found: set[str] = set()
    base_depth = root.count("/")
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
    others: list[str] = field(default_factory=list)  # appeared, not ours: left alone

    def __bool__(self) -> bool:
        return bool(self.processes or self.segments or self.sockets)

    def describe(self) -> str:
        lines = [f"process left running: {p}" for p in self.processes]
        lines += [f"shared-memory segment left in /dev/shm: {s}" for s in self.segments]
        lines += [f"ipc socket file left behind: {s}" for s in self.sockets]
        return "\n".join(lines)

    def warning(self, shown: int = 3) -> str:
        more = f" and {len(self.others) - shown} more" if len(self.others) > shown else ""
        return (f"{len(self.others)} file(s) appeared meanwhile that this code did not make (not "
                f"its names, not held by its processes), left alone: "
                + ", ".join(self.others[:shown]) + more)


def describe_process(p: psutil.Process) -> str:
    try:
        return f"pid {p.pid} ({' '.join(p.cmdline())[:120] or p.name()})"
    except psutil.Error:
        return f"pid {p.pid}"


def kill_processes(procs: list[psutil.Process], grace: float = 1.0,
                   first: signal.Signals = signal.SIGTERM) -> None:
    """Send `first` (SIGTERM), wait `grace` seconds, then SIGKILL whatever is still alive.

    multiprocessing's resource trackers go last: once the processes registered with one are
    gone, it unlinks the semaphores and segments they left (a spawn-context Queue makes three
    named semaphores in /dev/shm) and exits by itself. Killed with the rest, it leaves them."""
    trackers = [p for p in procs if is_resource_tracker(p)]
    _stop([p for p in procs if p not in trackers], first, grace)
    _stop(trackers, None, grace)


def _stop(procs: list[psutil.Process], sig: signal.Signals | None, grace: float) -> None:
    """Send sig (None: nothing), wait grace s, SIGKILL the rest."""
    if sig is not None:
        for p in procs:
            try:
                p.send_signal(sig)
            except psutil.Error:
                pass
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=grace)


def is_resource_tracker(p: psutil.Process, wait: float = 1.0) -> bool:
    """A process that has just exec'd reads an empty cmdline until the kernel has laid out its
    arguments; the parent may already run on (its exec pipe closes first). Wait that out."""
    deadline = time.monotonic() + wait
    try:
        while not (cmdline := p.cmdline()) and p.status() != psutil.STATUS_ZOMBIE \
                and time.monotonic() < deadline:
            time.sleep(0.01)
        return "multiprocessing.resource_tracker" in " ".join(cmdline)
    except psutil.Error:
        return False


def reap_zombies(pids) -> None:
    """Collect the exit status of dead children, adopted ones included."""
    for pid in pids:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass


def reap_orphans() -> list[int]:
    """Collect the zombies a subreaper adopted: when an engine core is killed, its workers come
    back to the subreaper and exit, and nobody else will ever wait for them. Every dead direct
    child that multiprocessing does not track is reaped (a subprocess.Popen of this process
    whose child is reaped here reads returncode 0 later: call this between tests, not during
    one). Returns the pids it reaped."""
    tracked = {p.pid for p in multiprocessing.active_children()}  # polls (reaps) its own first
    reaped = []
    for p in child_processes_direct():
        try:
            if p.pid not in tracked and p.status() == psutil.STATUS_ZOMBIE:
                os.waitpid(p.pid, os.WNOHANG)
                reaped.append(p.pid)
        except (psutil.Error, ChildProcessError):
            pass
    return reaped


def child_processes_direct() -> list[psutil.Process]:
    try:
        return psutil.Process().children(recursive=False)
    except psutil.NoSuchProcess:
        return []


def remove_paths(paths) -> None:
    for path in paths:
        try:
            os.unlink(path)
        except OSError:
            pass


class Snapshot:
    """What exists now; `leaks()` later tells what this process tree added, and removes it.

    prefix: names made under it are ours (default: this process's resource prefix).
    private_dirs: directories only the code under test uses; every socket in them is ours.
    socket_roots: (directory, depth) pairs where other sockets may appear (default: the temp dir).
    """

    def __init__(self, prefix: str | None = None, private_dirs: list[str] = (),
                 socket_roots: list[tuple[str | None, int]] = ((None, SOCKET_SCAN_DEPTH),)):
        self.prefix = prefix or resource_prefix()
        self.private_dirs = [d.rstrip("/") for d in private_dirs]
        self.socket_roots = socket_roots
        self.segments = shm_segments()
        self.sockets = self._shared_sockets()
        self.children = {p.pid for p in child_processes()}

    def _shared_sockets(self) -> set[str]:
        found = set().union(*(ipc_socket_files(root, depth) for root, depth in self.socket_roots))
        return {s for s in found if not self._private(s)}

    def _private(self, path: str) -> bool:
        return any(path.startswith(d + "/") for d in self.private_dirs)

    def leaks(self, settle: float = 3.0, extra_processes: list[psutil.Process] = ()) -> Leaks:
        """Wait up to `settle` s for children to exit by themselves, then report and clean."""
        deadline = time.monotonic() + settle
        new = self._new_children()
        procs = _dedupe([p for p in new + list(extra_processes) if _alive(p)])
        while procs and time.monotonic() < deadline:
            time.sleep(0.05)
            procs = [p for p in procs if _alive(p)]
        # List the files first and the holders second: a file made after the listing is
        # not looked at, and one made before it by our tree is still held when we look.
        segments, sockets = shm_segments() - self.segments, self._shared_sockets() - self.sockets
        segments -= _runtime_files_of_others(segments, {p.pid for p in new})
        private = set().union(*(ipc_socket_files(d, PRIVATE_SCAN_DEPTH)
                                for d in self.private_dirs if os.path.isdir(d)))
        held = holdings([os.getpid()] + [p.pid for p in child_processes()])
        found = Leaks(processes=[describe_process(p) for p in procs])
        kill_processes(procs)
        reap_zombies(p.pid for p in new)
        found.segments = sorted(s for s in segments if self._ours(f"{SHM_DIR}/{s}", held))
        found.sockets = sorted(private | {s for s in sockets if self._ours(s, held)})
        found.others = sorted({f"{SHM_DIR}/{s}" for s in segments if s not in found.segments}
                              | (sockets - set(found.sockets)))
        remove_paths(os.path.join(SHM_DIR, s) for s in found.segments)
        remove_paths(found.sockets)
        return found

    def _ours(self, path: str, held: set[str]) -> bool:
        return has_prefix_anywhere(path, self.prefix) or path in held

    def _new_children(self) -> list[psutil.Process]:
        return [p for p in child_processes() if p.pid not in self.children]


def _runtime_files_of_others(segments: set[str], ours: set[int]) -> set[str]:
    """The CUDA driver's and torch's files of a live process that is not one the code under test
    started (the runner itself, say): that process still needs them (runtime_shm)."""
    return {s for s in segments
            if (pid := owner_pid(s)) is not None and pid not in ours and psutil.pid_exists(pid)}


def has_prefix_anywhere(path: str, prefix: str) -> bool:
    """Whether any component of the path was named under prefix (a socket in a prefixed dir)."""
    return any(has_prefix(part, prefix) for part in path.split("/") if part)


def holdings(pids: list[int]) -> set[str]:
    """Paths of the /dev/shm segments these processes map and the unix sockets they bind."""
    held: set[str] = set()
    inodes: set[str] = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as f:
                for line in f:
                    parts = line.split(None, 5)
                    if len(parts) == 6 and parts[5].startswith(SHM_DIR + "/"):
                        held.add(parts[5].strip().removesuffix(" (deleted)"))
        except OSError:
            continue
        inodes |= _socket_inodes(pid)
    try:
        with open("/proc/net/unix") as f:
            next(f)
            for line in f:
                parts = line.split()
                if len(parts) >= 8 and parts[6] in inodes:
                    held.add(parts[7])
    except OSError:
        pass
    return held


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        pass
    return inodes


def _dedupe(procs: list[psutil.Process]) -> list[psutil.Process]:
    seen, out = set(), []
    for p in procs:
        if p.pid not in seen:
            seen.add(p.pid)
            out.append(p)
    return out


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
