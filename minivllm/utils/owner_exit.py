"""A run's owner that is terminated (SIGTERM) still stops its children and removes its run folder.

A Jupyter kernel is the common case: asked to shut down, it is sent SIGTERM when it does not
exit within half of jupyter_client's shutdown_wait_time, and SIGTERM's default action kills it
without running atexit, so the run folder (utils/run_dir.py) stayed behind. Raising SystemExit
from the handler, as a child does (utils/mp.py), is no answer in a kernel: IPython catches it.

So the first launch() in the main thread, where SIGTERM still has its default action, installs
a handler that cleans up within a bounded time, restores the default and sends SIGTERM again:
the process dies of SIGTERM exactly as it would have, minus the leftovers. A program that set
its own SIGTERM handler keeps it (and its own duty to exit cleanly).
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Callable

CLEANUP_GRACE_S = 0.5  # per child, per step: jupyter_client kills 2.5 s after its SIGTERM

_installed_in: int | None = None  # the pid whose handler is installed (a fork must install again)
_cleanups: list[Callable[[], None]] = []


def on_terminate(cleanup: Callable[[], None]) -> None:
    """Run cleanup() if this process is terminated; install the handler if it may. Each
    cleanup must end within a bounded time (CLEANUP_GRACE_S per step it waits)."""
    global _installed_in
    if cleanup not in _cleanups:
        _cleanups.append(cleanup)
    if _installed_in == os.getpid() or threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _terminate)
        _installed_in = os.getpid()


def _terminate(signum: int, frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        for cleanup in _cleanups:
            try:
                cleanup()
            except Exception:  # a failed cleanup must not keep the process alive
                pass
    finally:
        os.kill(os.getpid(), signal.SIGTERM)
