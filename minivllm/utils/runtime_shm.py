"""/dev/shm files that a runtime keeps for the whole life of a process.

Two runtimes put files there on their own when a process shares CUDA memory:
- the CUDA driver backs interprocess events with `cuda.shm.<n>.<pid in hex>.<n>`; a process that
  opens an event handle maps the exporter's file, so the file must outlive every export, and the
  driver leaves it behind when the process exits;
- torch keeps its CUDA IPC ref counters in `torch_<pid>_<random>_<n>` and unlinks it itself.

Deleting either while its process lives breaks that process (the next event handle fails with
"mapping of buffer object failed"; torch aborts at exit). So a leak check leaves the files of a
live process alone, and a process that exported CUDA IPC handles removes its driver file when it
exits (`remove_driver_files_at_exit`).
"""

from __future__ import annotations

import atexit
import os
import re

SHM_DIR = "/dev/shm"
_OWNER = (re.compile(r"cuda\.shm\.\d+\.([0-9a-f]+)\.\d+"), 16), (re.compile(r"torch_(\d+)_\d+_\d+"), 10)
_registered = False


def owner_pid(name: str) -> int | None:
    """The pid a runtime wrote into this file's name, or None for any other file."""
    for pattern, base in _OWNER:
        match = pattern.fullmatch(name)
        if match:
            return int(match.group(1), base)
    return None


def driver_files(pid: int) -> list[str]:
    """Paths of the CUDA driver's event files made by process `pid`."""
    try:
        names = os.listdir(SHM_DIR)
    except FileNotFoundError:
        return []
    return [os.path.join(SHM_DIR, n) for n in names
            if n.startswith("cuda.shm.") and owner_pid(n) == pid]


def _remove_own_driver_files() -> None:
    for path in driver_files(os.getpid()):
        try:
            os.unlink(path)
        except OSError:
            pass


def remove_driver_files_at_exit() -> None:
    """Once per process: at exit, remove the driver's event files named after this process."""
    global _registered
    if not _registered:
        _registered = True
        atexit.register(_remove_own_driver_files)
