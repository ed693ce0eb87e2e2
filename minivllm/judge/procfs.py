"""What graders read from /proc about the learner's processes, threads, descriptors and
mappings, and the signals they send to processes that may be gone already (Linux only, as the
exercises are)."""

from __future__ import annotations

import os
import signal


def stat_state(path: str) -> str:
    """The state letter in a /proc stat file (R running, S sleeping, D in the kernel, T
    stopped, Z exited, unreaped), or "X" where the process or thread is gone."""
    try:
        with open(path) as f:
            return f.read().rsplit(")", 1)[1].split()[0]  # after "(comm)", which may hold spaces
    except (FileNotFoundError, ProcessLookupError):
        return "X"


def process_state(pid: int) -> str:
    return stat_state(f"/proc/{pid}/stat")


def thread_state(tid: int) -> str:
    """The state of a thread of this process (threading.get_native_id())."""
    return stat_state(f"/proc/self/task/{tid}/stat")


def fd_count() -> int:
    """File descriptors this process has open."""
    return len(os.listdir("/proc/self/fd"))


def maps_shm(name: str) -> bool:
    """Whether this process still maps the shared-memory segment /dev/shm/name, unlinked
    ("(deleted)" in maps) or not."""
    with open("/proc/self/maps") as f:
        paths = [line.split("/dev/shm/", 1)[1].rstrip("\n") for line in f if "/dev/shm/" in line]
    return any(p.removesuffix(" (deleted)") == name for p in paths)


def signal_quietly(pid: int, sig: int) -> None:
    """Send sig to pid unless it is gone already."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def reaped(pid: int) -> bool:
    """Whether this child has been waited for (by the learner's code). Asking reaps nothing
    (WNOWAIT): a zombie reads False and stays one for kill_and_reap, so its pid cannot have
    gone to another process in between."""
    try:
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return False


def kill_and_reap(pid: int) -> None:
    """SIGKILL a child of this process and wait for it, whatever state it is in; nothing for
    one already reaped, whose pid may belong to another process by now."""
    if reaped(pid):
        return
    signal_quietly(pid, signal.SIGKILL)
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass
