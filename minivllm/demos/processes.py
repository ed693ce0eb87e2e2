"""Chapter 01's children and experiments that no benchmark runs: a child that is slow to
report ready, a middle process with children of its own, and a fork taken while another
thread holds a lock. They live in a module because spawn cannot send a function defined in a
notebook's __main__.
"""

from __future__ import annotations

import os
import threading
import time

from minivllm.bench.processes import ready_at_once
from minivllm.utils.mp import launch

LOCK_WAIT_S = 1.0  # a child that cannot take a free lock in this long never will


def slow_to_ready(link, delay_s: float) -> None:
    time.sleep(delay_s)  # a model load that takes too long
    link.ready()


def middle_with_children(link, n: int) -> None:
    """A parent in the middle: launches n children, reports their pids, then idles."""
    kids = [launch(ready_at_once, f"kid{i}", ready_timeout=60) for i in range(n)]
    link.ready([k.pid for k in kids])
    while True:
        time.sleep(0.1)


def _child_takes_lock(lock: threading.Lock) -> None:
    os._exit(0 if lock.acquire(timeout=LOCK_WAIT_S) else 1)


def fork_while_a_thread_holds_a_lock() -> str:
    """Fork while another thread holds a lock; the child's copy of the lock stays held forever."""
    lock, held = threading.Lock(), threading.Event()

    def holder():
        with lock:
            held.set()
            time.sleep(LOCK_WAIT_S * 2)
    t = threading.Thread(target=holder)
    t.start()
    held.wait()
    pid = os.fork()  # only this thread is copied; the lock is copied in its held state
    if pid == 0:
        _child_takes_lock(lock)
    _, status = os.waitpid(pid, 0)
    t.join()
    if os.waitstatus_to_exitcode(status) == 1:
        return (f"the forked child waited {LOCK_WAIT_S:g} s for the lock and gave up: the thread "
                "holding it was not copied, so nobody will ever release it")
    return "the child took the lock (the holder released it before the fork)"
