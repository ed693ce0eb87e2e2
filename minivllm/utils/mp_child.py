"""The child's side of utils/mp.launch: the link a target gets (ready once, then learn when to
stop), the thread that watches the death pipe, and the entry point that runs the target.
The parent's side and the pipes' story are in utils/mp.py."""

from __future__ import annotations

import multiprocessing.connection
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from typing import Any

from minivllm.utils.run_dir import mark_dead

PARENT_DEATH_GRACE_S = 1.0  # an orphan's target gets this long to return before SIGTERM to self
EXIT_PARENT_DIED = 3  # the exit code of a child that outlived its parent's grace
EXIT_TERMINATED = 128 + signal.SIGTERM  # the shell's code for "ended by SIGTERM"
_OWN_ALIVE_ENDS: list = []  # a launched child: the write end of its own alive pipe


class ChildLink:
    """What a child's target receives: report ready once, then learn when to stop."""

    def __init__(self, name: str, ready_conn: multiprocessing.connection.Connection):
        self.name = name
        self.parent_died = False
        self._ready_conn: multiprocessing.connection.Connection | None = ready_conn
        self._stop = threading.Event()

    @property
    def is_ready(self) -> bool:
        return self._ready_conn is None

    def ready(self, message: Any = None) -> None:
        """Tell the parent that set-up is done; `message` (picklable) becomes ready_message."""
        if self._ready_conn is None:
            raise RuntimeError(f"{self.name}: ready() called twice")
        self._ready_conn.send(("ready", message))
        self._ready_conn.close()
        self._ready_conn = None

    def should_stop(self) -> bool:
        return self._stop.is_set()

    def wait_stop(self, timeout: float | None = None) -> bool:
        """Block until a stop is requested (or the parent dies); False on timeout."""
        return self._stop.wait(timeout)

    def _fail(self, text: str) -> None:
        if self._ready_conn is not None:
            self._ready_conn.send(("error", text))
            self._ready_conn.close()
            self._ready_conn = None


def _raise_system_exit(signum: int, frame: Any) -> None:
    raise SystemExit(EXIT_TERMINATED)  # unwinds the target, so its finally blocks run


def _watch_parent(death_conn: multiprocessing.connection.Connection, link: ChildLink,
                  parent_pid: int) -> None:
    """Thread in the child: b"stop" sets the stop flag; EOF means the parent is gone."""
    try:
        while death_conn.recv_bytes() != b"":
            link._stop.set()
    except (EOFError, OSError):
        pass
    mark_dead(parent_pid)  # so that this survivor removes the run's folder if it was the owner's
    link.parent_died = True
    link._stop.set()
    time.sleep(PARENT_DEATH_GRACE_S)  # the target may return by itself
    os.kill(os.getpid(), signal.SIGTERM)  # it did not: unwind it with SystemExit
    time.sleep(PARENT_DEATH_GRACE_S)
    os._exit(EXIT_PARENT_DIED)  # stuck in C code: leave anyway


def _child_main(target: Any, args: tuple, kwargs: dict, name: str, ready_conn, death_conn,
                alive_conn, parent_ends: list, parent_pid: int) -> None:
    # Under fork the child holds copies of this launch's parent ends (the ones of earlier
    # launches went in _after_fork_in_child); an open copy of a death pipe's write end would
    # hide the parent's death (vLLM: WorkerProc.worker_main).
    for conn in parent_ends:
        conn.close()
    _OWN_ALIVE_ENDS.append(alive_conn)  # held until this process exits
    signal.signal(signal.SIGTERM, _raise_system_exit)
    link = ChildLink(name, ready_conn)
    watcher = threading.Thread(target=_watch_parent, args=(death_conn, link, parent_pid),
                               daemon=True, name=f"{name}-death-pipe")
    watcher.fork_safe = True  # it only blocks in read(2) and holds no lock a fork could copy
    watcher.start()
    try:
        if isinstance(target, bytes):  # pickled by launch(); unpickling imports its module
            target = pickle.loads(target)
        target(link, *args, **kwargs)
    except BaseException:
        if link.is_ready:
            raise
        link._fail(traceback.format_exc())
        sys.exit(1)
    if not link.is_ready:
        link._fail(f"{name}: the target returned without calling link.ready()")
        sys.exit(1)
