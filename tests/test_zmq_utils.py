"""minivllm.utils.zmq: real sockets, their options, addresses, identities, and cleanup."""

import multiprocessing
import os
import signal
import stat
import subprocess
import sys
import time

import psutil
import pytest
import zmq

from minivllm.utils import mp
from minivllm.utils.run_dir import RUN_DIR_ENV, owner_pid, run_dir
from minivllm.utils.zmq import (
    IpcDir, bound_address, close_all, dp_rank_identity, identity_to_rank, ipc_address,
    make_zmq_socket, tcp_address)

POLL_MS = 5000


@pytest.fixture
def ctx():
    c = zmq.Context()
    yield c
    c.term()  # hangs if a test forgot to close a socket with pending messages


@pytest.mark.parametrize("kind, hwm_opts", [
    (zmq.ROUTER, (zmq.SNDHWM, zmq.RCVHWM)), (zmq.DEALER, (zmq.SNDHWM, zmq.RCVHWM)),
    (zmq.PULL, (zmq.RCVHWM,)), (zmq.PUSH, (zmq.SNDHWM,))])
def test_engine_pipes_have_no_high_water_mark(ctx, kind, hwm_opts):
    sock = make_zmq_socket(ctx, tcp_address(), kind, bind=True, linger=0)
    try:
        assert all(sock.getsockopt(o) == 0 for o in hwm_opts)
        assert sock.getsockopt(zmq.LINGER) == 0
    finally:
        sock.close()


def test_pub_keeps_default_hwm_and_xpub_is_verbose(ctx):
    pub = make_zmq_socket(ctx, tcp_address(), zmq.PUB, linger=0)
    xpub = make_zmq_socket(ctx, tcp_address(), zmq.XPUB, linger=0)
    try:
        assert pub.getsockopt(zmq.SNDHWM) == 1000  # libzmq's default: PUB drops when full
        assert xpub.getsockopt(zmq.SNDHWM) == 1000
    finally:
        close_all(pub, xpub)


def test_tcp_port_zero_binds_a_free_port_and_reports_it(ctx):
    a = make_zmq_socket(ctx, "tcp://127.0.0.1:0", zmq.PULL, linger=0)
    b = make_zmq_socket(ctx, "tcp://127.0.0.1:0", zmq.PULL, linger=0)
    try:
        addr_a, addr_b = bound_address(a), bound_address(b)
        assert addr_a.startswith("tcp://127.0.0.1:") and addr_a != addr_b
        assert int(addr_a.rsplit(":", 1)[1]) > 0
        push = make_zmq_socket(ctx, addr_a, zmq.PUSH, linger=0)  # PUSH connects by default
        push.send(b"hello")
        assert a.poll(POLL_MS) and a.recv() == b"hello"
        push.close()
    finally:
        close_all(a, b)


def test_ipc_dir_is_private_and_removed_with_its_socket_files(ctx):
    with IpcDir() as d:
        assert stat.S_IMODE(os.stat(d.dir).st_mode) == 0o700
        router = make_zmq_socket(ctx, d.path("input"), zmq.ROUTER, linger=0)
        path = d.path("input").removeprefix("ipc://")
        assert stat.S_ISSOCK(os.stat(path).st_mode)
        router.close()
    assert d.closed and not os.path.exists(d.dir)


def test_ipc_dir_cleans_up_when_dropped():
    d = IpcDir()
    directory = d.dir
    del d
    assert not os.path.exists(directory)


def test_ipc_dir_rejects_names_that_escape():
    with IpcDir() as d:
        with pytest.raises(ValueError):
            d.path("../x")


def test_router_routes_by_dp_rank_identity(ctx):
    with IpcDir() as d:
        router = make_zmq_socket(ctx, d.path("in"), zmq.ROUTER, linger=0)
        engines = [make_zmq_socket(ctx, d.path("in"), zmq.DEALER, bind=False, linger=0,
                                   identity=dp_rank_identity(r)) for r in range(3)]
        try:
            for e in engines:
                e.send(b"ready")  # a ROUTER learns a peer's identity from its first message
            seen = set()
            for _ in engines:
                assert router.poll(POLL_MS)
                ident, msg = router.recv_multipart()
                seen.add(identity_to_rank(ident))
            assert seen == {0, 1, 2}
            router.send_multipart([dp_rank_identity(2), b"for two"])
            assert engines[2].poll(POLL_MS) and engines[2].recv() == b"for two"
            assert not engines[0].poll(50) and not engines[1].poll(50)
        finally:
            close_all(router, *engines)


def test_identity_encoding():
    assert dp_rank_identity(3) == b"\x03\x00" and dp_rank_identity(258) == b"\x02\x01"
    assert identity_to_rank(dp_rank_identity(65535)) == 65535
    with pytest.raises(ValueError):
        dp_rank_identity(70000)
    with pytest.raises(ValueError):
        identity_to_rank(b"\x00")


def test_failed_bind_closes_the_socket(ctx):
    a = make_zmq_socket(ctx, "tcp://127.0.0.1:0", zmq.PULL, linger=0)
    try:
        with pytest.raises(zmq.ZMQError):
            make_zmq_socket(ctx, bound_address(a), zmq.PULL)  # address in use
    finally:
        a.close()


# --- socket files of killed processes -------------------------------------------------------
GONE_WAIT_S = 15.0  # a loaded 2-core machine; the real wait is milliseconds


def binds_two_sockets(link):
    """A child that binds two ipc sockets, reports their paths, and waits to be stopped."""
    ctx = zmq.Context()
    socks = [ctx.socket(zmq.PULL) for _ in range(2)]
    for i, sock in enumerate(socks):
        sock.bind(ipc_address(f"s{i}"))
    link.ready([bound_address(sock).removeprefix("ipc://") for sock in socks])
    link.wait_stop()
    close_all(*socks)
    ctx.term()


def _wait_until(cond, timeout):
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.05)
    return cond()


def test_ipc_address_is_in_the_private_run_folder(ctx):
    address = ipc_address("mine")
    assert address.startswith(f"ipc://{run_dir()}/{os.getpid()}/mine-")
    assert stat.S_IMODE(os.stat(run_dir()).st_mode) == 0o700


def test_the_parent_removes_the_socket_files_of_a_killed_child():
    child = mp.launch(binds_two_sockets, "binder", context=multiprocessing.get_context("fork"))
    paths = child.ready_message
    assert all(p.startswith(run_dir() + "/") and stat.S_ISSOCK(os.stat(p).st_mode) for p in paths)
    os.kill(child.pid, signal.SIGKILL)  # nothing runs in the child: libzmq leaves both files
    child.shutdown()
    assert not any(os.path.exists(p) for p in paths), "socket files outlived their process"


ORPHAN_SCRIPT = """
import multiprocessing, sys, time
from minivllm.utils import mp
from minivllm.utils.run_dir import run_dir
from tests.test_zmq_utils import binds_two_sockets
child = mp.launch(binds_two_sockets, "binder", context=multiprocessing.get_context("fork"))
print(run_dir(), child.pid, flush=True)
time.sleep(60)
"""


def test_a_child_removes_the_run_folder_when_its_owner_was_killed():
    """The run's first process (the owner) is SIGKILLed: its child, the survivor, sees the
    death pipe close, exits, and removes the whole folder on its way out."""
    env = {k: v for k, v in os.environ.items() if k != RUN_DIR_ENV}  # a run of its own
    owner = subprocess.Popen([sys.executable, "-c", ORPHAN_SCRIPT], stdout=subprocess.PIPE,
                             text=True, env=env, cwd=os.path.dirname(os.path.dirname(__file__)))
    folder, pid = owner.stdout.readline().split()
    try:
        assert os.path.isdir(folder) and owner_pid(folder) == owner.pid
        owner.kill()
        owner.wait()
        assert _wait_until(lambda: not psutil.pid_exists(int(pid))
                           or psutil.Process(int(pid)).status() == psutil.STATUS_ZOMBIE,
                           GONE_WAIT_S), "the child outlived its killed parent"
        assert _wait_until(lambda: not os.path.exists(folder), GONE_WAIT_S), \
            f"{folder} outlived every process of its run: {os.listdir(folder)}"
    finally:
        owner.stdout.close()
        if psutil.pid_exists(int(pid)):
            os.kill(int(pid), signal.SIGKILL)


TWO_TEMP_DIRS_SCRIPT = """
import sys, tempfile
from minivllm.utils.run_dir import run_dir
first = run_dir()
tempfile.tempdir = sys.argv[1]  # as the test suite moves every test to a temp dir of its own
print(first, run_dir(), flush=True)
"""


def test_a_process_removes_every_run_folder_it_made(tmp_path):
    """Each temp dir gets its own run folder; at exit the owner removes them all, not only the
    one its environment names last (each pytest run left an empty folder in /tmp)."""
    env = {k: v for k, v in os.environ.items() if k != RUN_DIR_ENV}
    out = subprocess.run([sys.executable, "-c", TWO_TEMP_DIRS_SCRIPT, str(tmp_path)], env=env,
                         capture_output=True, text=True, check=True,
                         cwd=os.path.dirname(os.path.dirname(__file__)))
    first, second = out.stdout.split()
    assert first != second and os.path.dirname(second) == str(tmp_path), out.stdout
    assert not os.path.exists(first) and not os.path.exists(second)


FAULTS_SCRIPT = """
import resource, sys
import numpy as np, zmq
from minivllm.utils.zmq import reuse_large_receive_buffers
if sys.argv[1] == "tuned":
    assert reuse_large_receive_buffers()
ctx = zmq.Context()
push, pull = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL)
pull.bind("inproc://x"); push.connect("inproc://x")
data = np.ones(64 << 20, np.uint8)
faults = []
for _ in range(3):
    push.send(data, copy=True)  # libzmq mallocs a 64 MiB message, as a receive does
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    frame = pull.recv(copy=False)
    del frame
    push.send(data, copy=True)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    pull.recv(copy=False)
print(min(faults[1:]))
push.close(0); pull.close(0); ctx.term()
"""


def test_reuse_large_receive_buffers_stops_the_page_faults_of_each_large_message():
    """glibc maps a fresh 64 MiB buffer for each large message (16,384 faults); tuned, the
    freed buffer is reused. Counted in page faults, not time: the count does not depend on load."""
    def faults(mode):
        run = subprocess.run([sys.executable, "-c", FAULTS_SCRIPT, mode], capture_output=True,
                             text=True, timeout=120)
        assert run.returncode == 0, run.stderr[-2000:]
        return int(run.stdout.split()[-1])
    fresh, tuned = faults("default"), faults("tuned")
    assert fresh > 10_000, f"glibc's default should fault every page of the copy ({fresh})"
    assert tuned < 1_000, f"the tuned allocator still faulted {tuned} pages per 64 MiB message"
