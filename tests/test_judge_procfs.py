"""minivllm/judge/procfs.py on real processes, threads, descriptors and segments: what the
graders of exercises 122, 123, 201, 202, 213 and 402 read from /proc."""

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from multiprocessing import shared_memory

from minivllm.judge import procfs


def _wait_for(state: str, read, limit: float = 10.0) -> str:
    deadline, got = time.monotonic() + limit, read()
    while got != state and time.monotonic() < deadline:
        time.sleep(0.005)
        got = read()
    return got


def test_a_child_is_seen_asleep_stopped_then_a_zombie_until_reaped():
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)
    try:
        assert _wait_for("S", lambda: procfs.process_state(child.pid)) == "S"  # in its read
        procfs.signal_quietly(child.pid, signal.SIGSTOP)
        assert _wait_for("T", lambda: procfs.process_state(child.pid)) == "T"
        procfs.signal_quietly(child.pid, signal.SIGKILL)
        assert _wait_for("Z", lambda: procfs.process_state(child.pid)) == "Z"
        procfs.signal_quietly(child.pid, signal.SIGKILL)  # dead already: no error
        assert not procfs.reaped(child.pid)  # a zombie: nobody waited for it yet
        procfs.kill_and_reap(child.pid)
        assert procfs.reaped(child.pid) and procfs.process_state(child.pid) == "X"
    finally:  # never signal a pid once reaped: another process may have it by now
        child.stdin.close()
        if procfs.process_state(child.pid) != "X":
            procfs.kill_and_reap(child.pid)


def test_a_thread_blocked_in_a_read_sleeps():
    r, w = os.pipe()
    tid = []
    reader = threading.Thread(target=lambda: (tid.append(threading.get_native_id()),
                                              os.read(r, 1)))
    reader.start()
    try:
        while not tid:
            time.sleep(0.001)
        assert _wait_for("S", lambda: procfs.thread_state(tid[0])) == "S"
    finally:
        os.write(w, b"x")
        reader.join()
        os.close(r)
        os.close(w)
    # join() returns once Python is done with the thread; the kernel task may run a moment longer
    assert _wait_for("X", lambda: procfs.thread_state(tid[0])) == "X"


def test_descriptors_are_counted_and_segments_seen_until_unmapped():
    before = procfs.fd_count()
    r, w = os.pipe()
    assert procfs.fd_count() == before + 2
    os.close(r)
    os.close(w)
    assert procfs.fd_count() == before
    name = f"mvt_{uuid.uuid4().hex[:10]}"
    seg = shared_memory.SharedMemory(name=name, create=True, size=4096)
    try:
        assert procfs.maps_shm(name) and not procfs.maps_shm(name[:-1])  # the path, not a prefix
        seg.unlink()
        assert procfs.maps_shm(name)  # unlinked, still mapped: "(deleted)" in maps
    finally:
        seg.close()
    assert not procfs.maps_shm(name)
