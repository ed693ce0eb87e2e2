"""One private folder per run for every ipc:// socket file, so that the survivor can remove
what a killed process left.

libzmq (4.3.5) never unlinks an ipc:// socket file, not even on close, and a SIGKILLed process
runs no cleanup at all. So every socket file of a run lives under one folder (mode 0700: no
other user can connect either):

    $TMPDIR/<prefix>-run<owner pid>-<random>/   made by the run's first process, the owner;
                                                MINIVLLM_RUN_DIR names it to every child
        <pid>/<tag>-<random>                    utils/zmq.ipc_address(tag): process pid's sockets
        <tag>-<random>/<name>                   utils/zmq.IpcDir: a folder its maker removes

Who removes what:

    the process itself     its sockets on close (MessageQueue, IpcDir), its <pid> folder at exit
    launch()'s parent      a child's <pid> folder once the child is gone (utils/mp.py)
    the owner              the whole folder at exit
    any process at exit    the whole folder, if the owner is dead: it was killed
    a new owner            the folders of dead owners (its prefix, its user) when it makes its own;
                           an owner pid alive with another start time than the folder records
                           (OWNER_FILE) is a reused pid, and its owner dead
    a terminated owner     its children and folders, from its SIGTERM handler (utils/owner_exit.py)
"""

from __future__ import annotations

import glob
import multiprocessing.util
import os
import re
import shutil
import tempfile

import psutil

from minivllm.utils.resource_names import private_dir, resource_prefix

RUN_DIR_ENV = "MINIVLLM_RUN_DIR"
OWNER_FILE = "owner-start"  # in a run folder: its owner's start_ticks
_OWNER = re.compile(r"-run(\d+)-[^/]*$")
_cleanup_registered_in: int | None = None  # the pid whose exit removes its folders
_known_dead: set[int] = set()  # told by utils/mp: the parent's death pipe closed
# Every run folder this process made: a process whose temp dir changes (the test suite gives
# each test its own) makes one per temp dir, and owns all of them.
_made: list[str] = []


def run_dir() -> str:
    """The run's folder: the one MINIVLLM_RUN_DIR names, or a new one this process owns."""
    path = os.environ.get(RUN_DIR_ENV, "")
    # A folder in another temp dir belongs to an earlier run (the test suite gives each test
    # its own TMPDIR) and may be gone.
    if not (os.path.isdir(path) and os.path.dirname(path) == tempfile.gettempdir()):
        _sweep_dead_owners()
        path = private_dir(f"run{os.getpid()}")
        with open(os.path.join(path, OWNER_FILE), "w") as f:
            f.write(str(start_ticks(os.getpid())))
        _made.append(path)
        os.environ[RUN_DIR_ENV] = path  # children started from now on share it
    _register_cleanup()
    return path


def _sweep_dead_owners() -> None:
    """Remove this user's run folders of this prefix whose owner is dead: an owner that was
    SIGKILLed ran no cleanup, and nobody else would ever remove its folder."""
    pattern = os.path.join(tempfile.gettempdir(), f"{resource_prefix()}-run*-*")
    for path in glob.glob(pattern):
        owner = owner_pid(path)
        try:
            mine = os.stat(path).st_uid == os.getuid()
        except OSError:
            continue
        if mine and owner is not None and not _owner_alive(owner, path):
            shutil.rmtree(path, ignore_errors=True)


def process_dir(pid: int | None = None) -> str:
    """The folder of process pid (default: this one) inside the run's folder, made if needed."""
    path = os.path.join(run_dir(), str(pid or os.getpid()))
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


def remove_process_dir(pid: int) -> None:
    """Remove what process pid left in the run's folder: call once it is gone."""
    path = os.environ.get(RUN_DIR_ENV)
    if path:
        shutil.rmtree(os.path.join(path, str(pid)), ignore_errors=True)


def owner_pid(path: str) -> int | None:
    match = _OWNER.search(path)
    return int(match.group(1)) if match else None


def mark_dead(pid: int) -> None:
    """pid is dead, though it may look alive for a moment: a killed process closes its
    descriptors (the death pipe's EOF) before the kernel marks it a zombie."""
    _known_dead.add(pid)


def _pid_alive(pid: int) -> bool:
    """Alive and not a zombie (a killed owner whose parent has not reaped it yet is dead)."""
    if pid in _known_dead:
        return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def start_ticks(pid: int) -> int | None:
    """When process pid started, in clock ticks since boot (/proc/<pid>/stat's 22nd field): a
    pid's identity across reuse, unmoved by changes of the wall clock."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _owner_alive(pid: int, path: str) -> bool:
    """Whether process pid is alive and is the one that made `path`: a pid the kernel gave to
    a new process after the owner died has another start time than the one the owner wrote
    into its folder. A folder with no record (or no /proc) counts its live pid as its owner."""
    if not _pid_alive(pid):
        return False
    try:
        with open(os.path.join(path, OWNER_FILE)) as f:
            recorded = int(f.read())
    except (OSError, ValueError):
        return True
    now = start_ticks(pid)
    return now is None or now == recorded


def _register_cleanup() -> None:
    """Run remove_at_exit when this process exits: multiprocessing's exit hook runs in the main
    process (atexit) and in its children (which skip atexit); a forked child registers again.
    Priority -1: after that hook has joined this process's own children."""
    global _cleanup_registered_in
    if _cleanup_registered_in != os.getpid():
        _cleanup_registered_in = os.getpid()
        multiprocessing.util.Finalize(None, remove_at_exit, exitpriority=-1)


def remove_at_exit() -> None:
    """This process is ending: remove the run folders it owns, or its own <pid> folder."""
    for made in _made:
        if owner_pid(made) == os.getpid():  # not a forked child's inherited list
            shutil.rmtree(made, ignore_errors=True)
    path = os.environ.get(RUN_DIR_ENV)
    if not path or not os.path.isdir(path):
        return
    owner = owner_pid(path)
    if owner == os.getpid() or (owner is not None and not _owner_alive(owner, path)):
        shutil.rmtree(path, ignore_errors=True)
    else:
        remove_process_dir(os.getpid())
