"""The namespace cluster (utils/netns_cluster.py): hosts that share nothing but the network."""

import os
import signal
import subprocess
import sys

import pytest

from minivllm.utils import netns_cluster
from minivllm.utils.netns_cluster import NetnsCluster

pytestmark = pytest.mark.skipif(netns_cluster.unavailable() is not None,
                                reason=str(netns_cluster.unavailable()))
PY = sys.executable


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
    """SIGKILL the process that made a cluster: the next cluster removes what it left."""
    owner = subprocess.Popen(
        [PY, "-c", "from minivllm.utils.netns_cluster import NetnsCluster; import time, sys\n"
                   "c = NetnsCluster(2); p = c.popen(1, ['sleep', '600'])\n"
                   "print(c.name, flush=True); time.sleep(600)"],
        stdout=subprocess.PIPE, text=True)
    name = owner.stdout.readline().strip()
    owner.stdout.close()
    assert os.path.exists(f"/run/netns/{name}-h1")
    os.kill(owner.pid, signal.SIGKILL)
    owner.wait()
    assert os.path.exists(f"/run/netns/{name}-h1")  # nothing cleaned it yet
    swept = netns_cluster.sweep_stale()
    assert f"{name}-h1" in swept and f"{name}-sw" in swept
    assert not [n for n in os.listdir("/run/netns") if n.startswith(name)]
    assert not os.path.exists(os.path.join(netns_cluster.BASE_DIR, name))


def test_link_down_cuts_the_host_off():
    with NetnsCluster(2) as c:
        ping = f"{PY} -c \"import socket; socket.create_connection(('{c.addresses[1]}', 9), 1)\""
        assert "refused" in c.sh(0, ping).stderr  # reachable: the port is closed
        c.link_down(1)
        assert "timed out" in c.sh(0, ping).stderr
