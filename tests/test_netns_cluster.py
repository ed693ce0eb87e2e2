"""The namespace cluster (utils/netns_cluster.py): hosts that share nothing but the network."""

import os
import signal
import subprocess
import sys

import psutil
import pytest

from minivllm.utils import netns_cluster, netns_wire
from minivllm.utils.netns_cluster import NetnsCluster

pytestmark = pytest.mark.skipif(netns_cluster.unavailable() is not None,
                                reason=str(netns_cluster.unavailable()))
PY = sys.executable
DELAY_MS = 2.0  # per host's sends; a round trip crosses two delayed sends: +4 ms
DELAY_METHODS = ["wire"] + ([] if netns_wire.netem_missing() else ["tc netem"])


def _root_links() -> str:
    return subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True).stdout


def test_shm_made_on_one_host_is_invisible_on_another_and_tcp_crosses():
    name = f"minivllm-sep-{os.getpid()}"
    links_before = _root_links()
    with NetnsCluster(2) as c:
        make = (f"from multiprocessing import shared_memory as s, resource_tracker as r\n"
                f"m = s.SharedMemory({name!r}, create=True, size=4096)\n"
                f"r.unregister(m._name, 'shared_memory'); m.close()")
        assert c.sh(0, f"{PY} -c \"{make}\"").returncode == 0
        assert name in c.leftovers(0)
        assert name not in c.leftovers(1)
        assert not os.path.exists(f"/dev/shm/{name}")  # nor on the machine itself
        # a TCP connection from host 0 to host 1's address works
        server = c.popen(1, [PY, "-c", "import socket; s = socket.create_server(('"
                             + c.addresses[1] + "', 5555)); print('up', flush=True); "
                             "a, _ = s.accept(); a.sendall(a.recv(5))"],
                         stdout=subprocess.PIPE, text=True)
        assert server.stdout.readline().strip() == "up"
        client = c.sh(0, f"{PY} -c \"import socket; s = socket.create_connection(("
                      f"'{c.addresses[1]}', 5555)); s.sendall(b'hello'); print(s.recv(5))\"")
        assert client.stdout.strip() == "b'hello'", client.stderr
        assert server.wait(10) == 0
        server.stdout.close()
        # the machine's own network namespace got no link or address of the cluster's
        assert _root_links() == links_before
        hosts = c.hosts + [c.switch]
    assert not any(os.path.exists(f"/run/netns/{h}") for h in hosts)


def test_a_killed_owner_is_swept_by_the_next_cluster():
    """SIGKILL the process that made a cluster (with a delay wire): the wire ends by itself,
    and the next cluster removes what it left."""
    owner = subprocess.Popen(
        [PY, "-c", "from minivllm.utils.netns_cluster import NetnsCluster; import time, sys\n"
                   "c = NetnsCluster(2, delay_ms=1, delay_by='wire')\n"
                   "p = c.popen(1, ['sleep', '600'])\n"
                   "print(c.name, c._wire.pid, flush=True); time.sleep(600)"],
        stdout=subprocess.PIPE, text=True)
    name, wire_pid = owner.stdout.readline().split()
    owner.stdout.close()
    wire = psutil.Process(int(wire_pid))
    assert os.path.exists(f"/run/netns/{name}-h1") and wire.is_running()
    os.kill(owner.pid, signal.SIGKILL)
    owner.wait()
    wire.wait(netns_cluster.EXIT_TIMEOUT_S)  # its stdin read EOF (this process reaps it)
    assert os.path.exists(f"/run/netns/{name}-h1")  # nothing cleaned it yet
    swept = netns_cluster.sweep_stale()
    assert f"{name}-h1" in swept and f"{name}-sw" in swept
    assert not [n for n in os.listdir("/run/netns") if n.startswith(name)]
    assert not os.path.exists(os.path.join(netns_cluster.BASE_DIR, name))


@pytest.mark.parametrize("delay_by", DELAY_METHODS)
def test_a_delayed_link_adds_twice_the_delay_to_a_round_trip(delay_by):
    """ping from host 0 to host 1: each host's sends wait DELAY_MS, so a round trip gains
    2 x DELAY_MS. A frame never leaves early (the lower bound is exact); the fastest of 20
    pings also stays under twice that, which a delay applied at both ends of each link (4 x)
    would not."""
    with NetnsCluster(2) as c:
        plain = min(c.ping(0, 1)["rtt_ms"])
    with NetnsCluster(2, delay_ms=DELAY_MS, delay_by=delay_by) as c:
        assert c.delay_by == delay_by
        result = c.ping(0, 1)
        c.set_delay(0)  # while it runs: the round trip is back near the plain one
        undone = min(c.ping(0, 1)["rtt_ms"])
        wire = c._wire.pid if c._wire else None
        hosts = c.hosts + [c.switch]
    delayed = min(result["rtt_ms"])
    print(f"{delay_by}: after set_delay(0), ping RTT min {undone:.2f} ms")
    assert undone < 2 * DELAY_MS
    print(f"{delay_by}: ping RTT min {plain:.2f} ms -> {delayed:.2f} ms with {DELAY_MS} ms "
          f"on each host's sends (+{delayed - plain:.2f} ms; lost {result['lost']} of 20)")
    assert 2 * DELAY_MS <= delayed < plain + 4 * DELAY_MS, result
    assert not any(os.path.exists(f"/run/netns/{h}") for h in hosts)
    assert wire is None or not psutil.pid_exists(wire)


def test_link_down_cuts_the_host_off():
    with NetnsCluster(2) as c:
        ping = f"{PY} -c \"import socket; socket.create_connection(('{c.addresses[1]}', 9), 1)\""
        assert "refused" in c.sh(0, ping).stderr  # reachable: the port is closed
        c.link_down(1)
        assert "timed out" in c.sh(0, ping).stderr
