"""Failure timing as settings under vLLM's names (minivllm/envs.py, --distributed-timeout-
seconds), on this machine's loopback:

- the start window of a multi-node group is the process group's rendezvous, which gives up
  after --distributed-timeout-seconds (60 s by default, not the 120 s the ready wait allows):
  a leader whose other nodes never come fails with an error naming the flag;
- VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS is a step's deadline: a stopped (not dead) worker makes
  the step fail with an error naming it;
- VLLM_HOST_IP is the address a node advertises, IPv6 too; the heartbeats' interval and
  timeout come from MINIVLLM_HEARTBEAT_INTERVAL_MS / _TIMEOUT_MS in every process;
- the launcher's tcp ports are bound before any engine learns them.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import psutil
import pytest

from minivllm import envs
from minivllm.distributed.parallel_state import advertised_ip, get_open_port
from minivllm.distributed.shm_broadcast import MessageQueue

HERE = os.path.dirname(__file__)
HANG_S = 120.0  # a hang check, far above every timeout set here


def run(argv: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, *argv], env={**os.environ, **env}, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def test_a_leader_alone_gives_up_after_the_distributed_timeout_naming_it(tiny_dir):
    start = time.monotonic()
    leader = run(["-m", "minivllm.cli", "serve", tiny_dir, "-tp", "3", "--nnodes", "3",
                  "--master-port", str(get_open_port()), "--port", str(get_open_port()),
                  "--num-threads", "1", "--distributed-timeout-seconds", "3"], {})
    out = leader.communicate(timeout=HANG_S)[0]
    print(f"a leader without its nodes failed after {time.monotonic() - start:.1f} s "
          "(--distributed-timeout-seconds 3)")
    assert leader.returncode != 0, out[-3000:]
    assert "did not gather its 3 ranks within 3 s (--distributed-timeout-seconds)" in out, \
        out[-3000:]


def test_a_stopped_worker_fails_the_step_after_vllm_execute_model_timeout_seconds(tiny_dir):
    driver = run([os.path.join(HERE, "multinode_driver.py"), "until_dead",
                  f'{{"model": "{tiny_dir}", "tensor_parallel_size": 3, "num_threads": 1}}'],
                 {envs.EXECUTE_MODEL_TIMEOUT_ENV: "2"})
    stopped, lines = None, []
    try:
        assert driver.stdout.readline().strip() == "generating"
        time.sleep(0.5)  # steps are running
        stopped = next(p for p in psutil.Process(driver.pid).children(recursive=True)
                       if "Worker_TP1" in " ".join(p.cmdline()) + p.name())
        stopped.send_signal(signal.SIGSTOP)  # alive to its sentinel, silent to the step
        reader = threading.Thread(target=lambda: lines.extend(driver.stdout), daemon=True)
        reader.start()
        deadline = time.monotonic() + HANG_S
        while not any('"dead_at"' in line for line in lines) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        if stopped is not None and stopped.is_running():
            stopped.kill()  # the step gave up on it; the test ends it
        try:
            driver.wait(HANG_S)
        finally:
            if driver.poll() is None:
                driver.kill()
                driver.wait()
    out = "".join(lines)
    assert '"dead_at"' in out, out[-3000:]
    assert f"did not reply within 2 s (the deadline of the whole call, " \
           f"{envs.EXECUTE_MODEL_TIMEOUT_ENV})" in out, out[-3000:]


@pytest.mark.parametrize("name, value", [(envs.EXECUTE_MODEL_TIMEOUT_ENV, "0"),
                                         (envs.HEARTBEAT_TIMEOUT_ENV, "3s")])
def test_bad_timing_settings_are_refused_by_name(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=name):
        envs.execute_model_timeout_s() if "EXECUTE" in name else envs.heartbeat_ms()


def test_heartbeat_settings_reach_the_ring():
    code = ("from minivllm.distributed import shm_broadcast as s; "
            "print(s.HEARTBEAT_IVL_MS, s.HEARTBEAT_TIMEOUT_MS)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, envs.HEARTBEAT_INTERVAL_ENV: "200",
                              envs.HEARTBEAT_TIMEOUT_ENV: "700"}, check=True).stdout
    assert out.split() == ["200", "700"]


def test_vllm_host_ip_is_advertised_and_may_be_ipv6(monkeypatch):
    assert advertised_ip("127.0.0.1") == "127.0.0.1"  # unset: the address toward the leader
    monkeypatch.setenv(envs.HOST_IP_ENV, "::1")
    writer = MessageQueue(1, 0, connect_ip=advertised_ip("127.0.0.1"))
    got: list[int] = []

    def remote_reader() -> None:
        with MessageQueue.create_from_handle(writer.export_handle(), 0) as mq:
            mq.wait_until_ready(30)
            got.extend(mq.dequeue(timeout=30) for _ in range(3))

    reader = threading.Thread(target=remote_reader)
    reader.start()
    try:
        assert writer.export_handle().remote_subscribe_addr.startswith("tcp://[::1]:")
        writer.wait_until_ready(30)
        for i in range(3):
            writer.enqueue(i)
        reader.join(30)
    finally:
        writer.close()
    assert got == [0, 1, 2]


def test_the_launcher_binds_the_client_ports_before_handing_them_out(tiny_dir):
    from minivllm.engine.config import EngineConfig
    from minivllm.engine.launcher import _engine_addresses
    from minivllm.utils.zmq import IpcDir
    config = EngineConfig(model=tiny_dir, data_parallel_size=2, data_parallel_size_local=1)
    ipc_dir = IpcDir()
    _, addresses, listeners = _engine_addresses(config, ipc_dir, 2)
    try:
        assert len(listeners) == 4
        for address, listener in zip(addresses.inputs + addresses.outputs, listeners):
            port = int(address.rsplit(":", 1)[1])
            assert listener.getsockname()[1] == port
            with socket.socket() as other, pytest.raises(OSError):
                other.bind(("127.0.0.1", port))  # held from the start: no race to lose
    finally:
        for listener in listeners:
            listener.close()
        ipc_dir.close()
