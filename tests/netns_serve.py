"""What the namespace-host serve tests share: `minivllm serve` and driver processes on a host
of a NetnsCluster, and the drivers' JSON lines (tests/dp_nodes_driver.py,
tests/multinode_driver.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from minivllm.utils.netns_cluster import NetnsCluster
from test_multinode_netns import last_json

HERE = os.path.dirname(__file__)
HTTP_PORT = 8000  # each cluster has its own network: nobody else holds it
DEAD_WITHIN_S = 60.0  # a hang check; the measured delay is printed
RUN_TIMEOUT_S = 840.0  # a hang check: start-up (the driver waits up to 540 s for /health) + the run


def serve(c: NetnsCluster, host: int, model: str, *flags: str,
          env: dict[str, str] | None = None) -> subprocess.Popen:
    """`minivllm serve MODEL FLAGS` on host, one torch thread a worker, output piped."""
    argv = [sys.executable, "-m", "minivllm.cli", "serve", model, "--num-threads", "1", *flags]
    return c.popen(host, argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                   text=True)


def api_flags(c: NetnsCluster, host: int) -> list[str]:
    return ["--host", c.addresses[host], "--port", str(HTTP_PORT)]


def url(c: NetnsCluster, host: int) -> str:
    return f"http://{c.addresses[host]}:{HTTP_PORT}"


def client(c: NetnsCluster, host: int, *argv: str) -> subprocess.Popen:
    """A driver process on `host`, reaching the others over the bridge."""
    return c.popen(host, [sys.executable, *argv], stdout=subprocess.PIPE, text=True)


def streams(c: NetnsCluster, host: int, target: str, model: str, n: int) -> subprocess.Popen:
    """n concurrent streams through the openai client from `host` to the server at target."""
    return client(c, host, os.path.join(HERE, "dp_nodes_driver.py"),
                  json.dumps({"url": target, "model": model, "n": n}))


def streams_report(proc: subprocess.Popen) -> dict:
    return last_json(proc.communicate(timeout=RUN_TIMEOUT_S)[0])


def kill_and_probe(c: NetnsCluster, target: str, victim_parent: int, name: str,
                   probe_host: int) -> dict:
    """Start a long stream at target, SIGKILL the child of victim_parent (a pid on this
    machine) whose title holds `name`, and return the probe's report with the delay from the
    kill to the 503, in ms ("after_ms")."""
    probe = client(c, probe_host, os.path.join(HERE, "multinode_driver.py"), "probe",
                   json.dumps({"url": target}))
    assert probe.stdout.readline().strip() == "streaming"
    victims = [p for p in psutil.Process(victim_parent).children(recursive=True)
               if name in p.name() + " ".join(p.cmdline())]
    assert victims, f"no process {name!r} under pid {victim_parent}"
    victims[0].send_signal(signal.SIGKILL)
    killed = time.time()
    try:
        health = last_json(probe.communicate(timeout=DEAD_WITHIN_S)[0])
    except subprocess.TimeoutExpired:
        pytest.fail(f"/health did not turn 503 within {DEAD_WITHIN_S:g} s of the kill")
    health["after_ms"] = None if health["at"] is None else (health["at"] - killed) * 1000
    return health
