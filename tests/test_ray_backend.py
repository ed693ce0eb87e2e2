"""The Ray backend (executor/ray_executor.py): a clear error at once without Ray or where an
address given has no cluster; and TP=3 on a real three-node Ray cluster (a head and two
workers), each node a network-namespace host of its own (utils/netns_cluster.py: root only),
so the cluster's ports and files meet no other run. Ray starts the ranks as actors; the ring,
the replies and gloo cross the hosts as TCP, as with --nnodes (tests/test_multinode_netns.py).
The cluster serves `minivllm serve` end to end, found as vLLM finds it (no address: the one
`ray start` began on that node), with the same tokens as the mp backend on one host; then
LLM(...) in a Ray actor takes the actor's placement group; then LLM(...) runs until rank 0's
actor is killed. On a host with no cluster, LLM(...) starts a local Ray and stops it again.

Stopping the cluster: never `ray stop` (it stops every Ray process of the machine, other
users' too): the test ends the processes in its own hosts' namespaces, and checks that no
process and no file is left on any host.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from minivllm.engine.config import EngineConfig
from minivllm.entrypoints import serve
from minivllm.executor.ray_utils import LOCAL_OBJECT_STORE_BYTES, local_instance_args
from minivllm.utils import netns_cluster
from minivllm.utils.load_scale import stretched
from minivllm.utils.netns_cluster import NetnsCluster
from test_multinode_netns import last_json, wait_until_generating

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DRIVER = os.path.join(REPO, "tests", "multinode_driver.py")
RAY_DRIVER = os.path.join(REPO, "tests", "ray_driver.py")
RAY = os.path.join(os.path.dirname(sys.executable), "ray")
GCS_PORT = 6379  # each cluster has its own network: no other program holds it there
# Ray's temp dir, the same path on every host, private to each: Ray's default ($RAY_TMPDIR/ray)
# for every process of the test, so ray.init() finds the cluster `ray start` began on its host
# (ray_current_cluster there), as it finds /tmp/ray's on a machine
RAY_TMPDIR = "/dev/shm"
RAY_DIR = os.path.join(RAY_TMPDIR, "ray")
# Ray's smallest object store (75 MiB) and a little, as minivllm's local ray.init asks for;
# minivllm passes nothing through it. Explicit: Ray's own default is a share of the memory
# free at the moment, below its minimum while another run fills the machine
OBJECT_STORE_BYTES = LOCAL_OBJECT_STORE_BYTES
# hang checks below stretch with the load, as minivllm's start timeouts do (stretched)
RAY_START_TIMEOUT_S = 120.0
CLI_TIMEOUT_S = 300.0  # a hang check: the CLI imports torch and Ray (over 60 s at load 20)
# Ray waits a fixed 30 s for its raylet to register (ray/_private/node.py); on a loaded 2-core
# machine that can pass, and `ray start` fails with this. The fixture tries again.
RAY_SLOW_START = "timed out during startup"
RAY_START_TRIES = 3
RUN_TIMEOUT_S = 240.0
DEAD_WITHIN_S = 60.0  # a hang check; the measured delay is printed
NO_CLUSTER = "127.0.0.1:1"  # port 1: nothing listens there
HTTP_PORT = 8000  # inside the cluster's own network
STOP_WITHIN_S = 30.0  # a hang check: ray.kill ends an actor's process asynchronously


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          timeout=stretched(CLI_TIMEOUT_S), env={**os.environ, **(env or {})})


def test_an_address_with_no_cluster_fails_at_once_saying_how_to_start_one(monkeypatch):
    """An address where no head answers, given as ray_address, --ray-address (serve's own
    check, in this process) or $RAY_ADDRESS (the CLI: one process start, it imports Ray and
    torch): an error at once, with no traceback. No address at all is not an error: ray.init
    finds or starts a cluster (test_no_cluster_anywhere_...)."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(ValueError, match="ray start --head"):
        EngineConfig(tensor_parallel_size=3, distributed_executor_backend="ray",
                     ray_address=NO_CLUSTER)
    with pytest.raises(SystemExit, match="ray start --head"):
        serve.main(["-tp", "3", "--distributed-executor-backend", "ray",
                    "--ray-address", NO_CLUSTER])
    r = cli("-m", "minivllm.cli", "serve", "-tp", "3", "--distributed-executor-backend",
            "ray", env={"RAY_ADDRESS": NO_CLUSTER})
    assert r.returncode != 0 and "ray start --head" in r.stderr, r.stderr[-2000:]
    assert "Traceback" not in r.stderr


def test_without_ray_installed_the_error_says_what_to_install(monkeypatch):
    """`import ray` failing, as where it is not installed (sys.modules[name] = None makes
    the import raise ImportError); serve's own check, in this process."""
    monkeypatch.setitem(sys.modules, "ray", None)
    monkeypatch.setenv("RAY_ADDRESS", NO_CLUSTER)
    with pytest.raises(SystemExit) as exit_:
        serve.main(["-tp", "3", "--distributed-executor-backend", "ray"])
    message = str(exit_.value)
    assert "pip install ray==2.60.0" in message and "ray start --head" in message, message


def test_a_local_ray_gets_an_explicit_object_store_and_a_cluster_none(monkeypatch, tmp_path):
    """ray.init starting a local instance is given its object store size (Ray's own default,
    a share of the memory free at that moment, fell below Ray's 75 MiB minimum while another
    run filled the machine: ValueError); ray.init joining a cluster is given none (it refuses
    one)."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))  # no cluster was started here
    assert local_instance_args(None) == {"object_store_memory": LOCAL_OBJECT_STORE_BYTES}
    assert local_instance_args(NO_CLUSTER) == {}
    monkeypatch.setenv("RAY_ADDRESS", NO_CLUSTER)
    assert local_instance_args(None) == {}


# --- a real cluster ------------------------------------------------------------------------
def ray_env() -> dict[str, str]:
    """No usage stats, Ray's temp dir on each host's own /dev/shm, and no token auth: unset,
    a local ray.init() writes a token to ~/.ray/auth_token (shared by every user of the
    machine), and from then on every `ray start --head` here demands it."""
    return {"RAY_USAGE_STATS_ENABLED": "0", "RAY_TMPDIR": RAY_TMPDIR,
            "RAY_AUTH_MODE": "disabled", "PYTHONPATH": os.environ.get("PYTHONPATH", REPO)}


def ray_start(c: NetnsCluster, i: int) -> subprocess.Popen:
    """`ray start` on host i (the head on host 0): one CPU, no dashboard, no log monitor
    (actors' output stays in RAY_DIR's log files: one Python process less per node), a
    small object store; it returns once the node's daemons run."""
    common = ["--num-cpus=1", "--disable-usage-stats",
              "--include-log-monitor=false",
              f"--object-store-memory={OBJECT_STORE_BYTES}", f"--node-ip-address={c.addresses[i]}"]
    role = ([f"--port={GCS_PORT}", "--include-dashboard=false"]
            if i == 0 else [f"--address={c.addresses[0]}:{GCS_PORT}"])
    return c.popen(i, [RAY, "start", *(["--head"] if i == 0 else []), *role, *common],
                   env=ray_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def start_cluster(c: NetnsCluster) -> float:
    """A head on host 0 and a worker node on each other host; the seconds it took."""
    t0 = time.monotonic()
    for group in ([0], list(range(1, len(c.hosts)))):  # workers need the head
        procs = {i: ray_start(c, i) for i in group}
        for i, p in procs.items():
            out = p.communicate(timeout=stretched(RAY_START_TIMEOUT_S))[0]
            for _ in range(RAY_START_TRIES - 1):
                if not (p.returncode and RAY_SLOW_START in out):
                    break
                print(f"ray start on host {i} timed out (load?), again:\n{out[-800:]}")
                c.stop_processes(i)  # a fresh host: nothing of the failed start is left
                c.sh(i, f"rm -rf {RAY_DIR}")
                p = ray_start(c, i)
                out = p.communicate(timeout=stretched(RAY_START_TIMEOUT_S))[0]
            assert p.returncode == 0, out[-3000:]
    return time.monotonic() - t0


def stop_cluster(c: NetnsCluster) -> None:
    """Every process of this cluster, host by host (SIGTERM, then SIGKILL), and Ray's files."""
    for i in range(len(c.hosts)):
        c.stop_processes(i)
        c.sh(i, f"rm -rf {RAY_DIR}")


def rss_mib(c: NetnsCluster) -> float:
    """Resident memory of everything running on the cluster's hosts, MiB."""
    total = 0
    for pid in [p for i in range(len(c.hosts)) for p in c.processes(i)]:
        try:
            total += psutil.Process(pid).memory_info().rss
        except psutil.Error:
            pass  # exited meanwhile
    return total / 2**20


@pytest.fixture(scope="module")
def ray_cluster():
    why = netns_cluster.unavailable()
    if why:
        pytest.skip(why)
    with NetnsCluster(3) as c:
        try:
            took = start_cluster(c)
            print(f"ray cluster of 3 nodes started in {took:.1f} s, {rss_mib(c):.0f} MiB RSS")
            yield c
        finally:
            stop_cluster(c)
        for i in range(3):
            assert c.processes(i) == [] and c.leftovers(i) == [], f"host {i} kept something"


def start_leader(c: NetnsCluster, mode: str, model: str | None) -> subprocess.Popen:
    """tests/multinode_driver.py on host 0 (a node of the cluster): LLM(...) with TP=3 over Ray."""
    args = dict(model=model, tensor_parallel_size=3, distributed_executor_backend="ray",
                ray_address=f"{c.addresses[0]}:{GCS_PORT}", num_threads=1)
    return c.popen(0, [sys.executable, DRIVER, mode, json.dumps(args)], env=ray_env(),
                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def minivllm_files(c: NetnsCluster) -> dict[int, list[str]]:
    """What lies in each host's /dev/shm and TMPDIR besides Ray's own folder, by host."""
    found = {i: [x for x in c.leftovers(i) if x != os.path.basename(RAY_DIR)]
             for i in range(len(c.hosts))}
    return {i: names for i, names in found.items() if names}


def host_processes(c: NetnsCluster, i: int) -> list[psutil.Process]:
    """What runs on host i, as psutil processes (one that exits meanwhile is left out)."""
    found = []
    for pid in c.processes(i):
        try:
            found.append(psutil.Process(pid))
        except psutil.Error:
            pass
    return found


def ray_processes(c: NetnsCluster, hosts: list[int] | None = None,
                  titles: tuple[str, ...] = ("RayWorker",)) -> list[psutil.Process]:
    """The Ray worker processes of minivllm's actors on these hosts (default: every host),
    titled ray::RayWorker... (or ray::<one of titles>...)"""
    found = []
    for p in [p for i in (range(len(c.hosts)) if hosts is None else hosts)
              for p in host_processes(c, i)]:
        try:
            if any(t in " ".join(p.cmdline()) for t in titles):
                found.append(p)
        except psutil.Error:
            pass  # exited meanwhile
    return found


def test_serve_tp3_on_the_ray_cluster_answers_with_one_hosts_tokens_and_stops_clean(
        ray_cluster, one_host_tp3_tokens):
    """`minivllm serve -tp 3 --distributed-executor-backend ray` on host 0 (the real model),
    with no address and no $RAY_ADDRESS: ray.init's default finds the cluster `ray start`
    began on host 0, as vLLM's does, and its ranks land one on each host. The official openai
    client on host 1: the chat answer's greedy tokens are the mp backend's on one host.
    SIGTERM: the server exits 0, its actors' processes end, and no host keeps a file of
    minivllm's (Ray's own folder, RAY_DIR, stays with the cluster)."""
    c = ray_cluster
    url = f"http://{c.addresses[0]}:{HTTP_PORT}"
    t0 = time.monotonic()
    server = c.popen(0, [sys.executable, "-m", "minivllm.cli", "serve", "--host", c.addresses[0],
                         "--port", str(HTTP_PORT), "-tp", "3", "--num-threads", "1",
                         "--distributed-executor-backend", "ray"],
                     env=ray_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    client = c.popen(1, [sys.executable, DRIVER, "chat", json.dumps({"url": url})],
                     stdout=subprocess.PIPE, text=True)
    reply = client.communicate(timeout=stretched(RUN_TIMEOUT_S))[0]
    print(f"serve, TP=3 over Ray, start and one chat completion: {time.monotonic() - t0:.1f} s")
    ranks_on = sorted(i for i in range(len(c.hosts)) for _ in ray_processes(c, [i]))
    server.send_signal(signal.SIGTERM)
    out = server.communicate(timeout=stretched(RUN_TIMEOUT_S))[0]
    assert client.returncode == 0 and reply, out[-4000:]
    answer = json.loads(reply.splitlines()[-1])
    assert "Paris" in answer["text"] and answer["tokens"] == one_host_tp3_tokens, answer
    assert server.returncode == 0, out[-4000:]
    assert "Ray actor" not in out  # no rank was reported dead
    assert ranks_on == [0, 1, 2], f"the ranks ran on hosts {ranks_on}, not on the cluster's three"
    _, alive = psutil.wait_procs(ray_processes(c), timeout=stretched(STOP_WITHIN_S))
    assert alive == [], f"actors' processes still run: {alive}"
    assert minivllm_files(c) == {}, f"left on the hosts: {minivllm_files(c)}"


def test_kill_9_of_rank_0s_actor_is_heard_through_ray(ray_cluster, tiny_dir):
    """Rank 0's actor, on the driver's host, is SIGKILLed mid-generation. Its replies come
    over shared memory and its process is not the engine's child: no sentinel, no connection
    drops. Ray tells (ray.wait on its run() reference), and LLM.generate raises
    EngineDeadError. (A remote rank's death is also heard on its reply connection, as in
    tests/test_multinode_netns.py.)"""
    c = ray_cluster
    leader = start_leader(c, "until_dead", tiny_dir)
    wait_until_generating(leader)
    print(f"generating: {rss_mib(c):.0f} MiB RSS on the three hosts")
    # host 0 holds one rank, rank 0 (the driver's node comes first); Ray titles its process
    # ray::RayWorker.run
    (rank0,) = [p for p in c.processes(0) if "RayWorker" in " ".join(psutil.Process(p).cmdline())]
    os.kill(rank0, signal.SIGKILL)
    killed = time.time()
    try:
        out = leader.communicate(timeout=stretched(DEAD_WITHIN_S))[0]
    except subprocess.TimeoutExpired:
        pytest.fail(f"LLM.generate did not fail within {stretched(DEAD_WITHIN_S):.0f} s of "
                    "the kill")
    report = last_json(out)
    print(f"kill -9 of rank 0's actor -> EngineDeadError in {report['dead_at'] - killed:.2f} s")
    assert report["error"], out[-4000:]
    assert f"worker 0 (Ray actor on {c.addresses[0]}) died (ActorDiedError" in out, out[-4000:]


def test_llm_in_a_ray_actor_takes_the_actors_placement_group(ray_cluster, tiny_dir):
    """tests/ray_driver.py: a Ray job reserves one CPU on each node (STRICT_SPREAD), every
    CPU of the cluster, and runs LLM(TP=3, ray, no address) in an actor placed in that group.
    The ranks take its bundles (the group has no free CPU while the engine runs; a group of
    minivllm's own could not be placed at all), and the group outlives the engine."""
    c = ray_cluster
    args = dict(model=tiny_dir, tensor_parallel_size=3, distributed_executor_backend="ray",
                num_threads=1)
    driver = c.popen(0, [sys.executable, RAY_DRIVER, "in_actor", f"{c.addresses[0]}:{GCS_PORT}",
                         json.dumps(args)], env=ray_env(), stdout=subprocess.PIPE,
                     stderr=subprocess.STDOUT, text=True)
    out = driver.communicate(timeout=stretched(RUN_TIMEOUT_S))[0]
    assert driver.returncode == 0, out[-4000:]
    report = last_json(out)
    assert len(report["tokens"]) == 8 and report["pg_free_cpus"] == 0, report
    assert report["pg_state"] == "CREATED", report
    # the ranks' actors, and the driver's LLMActor, whose process exits after its reply (at
    # load ~20 it was still there when the test ended)
    _, alive = psutil.wait_procs(ray_processes(c, titles=("RayWorker", "LLMActor")),
                                 timeout=stretched(STOP_WITHIN_S))
    assert alive == [], f"actors' processes still run: {alive}"
    # the actor's process exits after its reply
    deadline = time.monotonic() + stretched(STOP_WITHIN_S)
    while minivllm_files(c) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert minivllm_files(c) == {}, f"left on the hosts: {minivllm_files(c)}"


def test_no_cluster_anywhere_starts_a_local_ray_and_stops_it(tiny_dir):
    """A host with no Ray cluster, no address, no $RAY_ADDRESS: LLM(ray backend) starts a
    local Ray instance (ray.init's default, as vLLM's), places its rank there, and its
    shutdown stops that instance: no process is left on the host. TP=1: the local instance
    has this machine's CPUs, and the tiny model splits only by 3."""
    why = netns_cluster.unavailable()
    if why:
        pytest.skip(why)
    args = dict(model=tiny_dir, distributed_executor_backend="ray", num_threads=1)
    env = ray_env()  # the executor sizes the local object store itself (local_instance_args)
    with NetnsCluster(1) as c:
        for _ in range(RAY_START_TRIES):
            t0 = time.monotonic()
            leader = c.popen(0, [sys.executable, DRIVER, "generate", json.dumps(args)], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            out = leader.communicate(timeout=stretched(RUN_TIMEOUT_S))[0]
            print(f"local Ray start, one rank and one chat: {time.monotonic() - t0:.1f} s")
            if not (leader.returncode and RAY_SLOW_START in out):
                break
            print("ray.init's local start timed out (load?), again")
            c.stop_processes(0)
            c.sh(0, f"rm -rf {RAY_DIR}")
        assert leader.returncode == 0, out[-4000:]
        assert len(json.loads(out.splitlines()[-1])["tokens"]) == 8, out[-4000:]
        _, alive = psutil.wait_procs(host_processes(c, 0),
                                     timeout=stretched(STOP_WITHIN_S))
        assert alive == [], f"the local Ray's processes still run: {alive}"
        c.sh(0, f"rm -rf {RAY_DIR}")
