"""Multi-node tensor parallelism across hosts that share nothing but a network: three network
namespace hosts (utils/netns_cluster.py), each with its own /dev/shm, TMPDIR and IPC. The
leader (host 0) runs LLM(...) in tests/multinode_driver.py; hosts 1 and 2 run
`minivllm serve --headless`. Every byte between the ranks crosses the hosts' links and a
bridge as TCP. The TP test's links can be delayed while it runs (NetnsCluster.set_delay): tc
netem where the kernel has it, else the userspace wire of utils/netns_wire.py (TAP devices),
so the delayed run happens on every kernel; the test prints which one ran.

Remote death (sentinels and pidfds do not cross hosts): the leader hears it on the reply
connection of the dead rank (distributed/peer_watch.py). A killed process's kernel closes its
connections at once (FIN): milliseconds. A cut link sends nothing: the ZMTP heartbeat drops
the connection after shm_broadcast.HEARTBEAT_TIMEOUT_MS (3 s) of silence, plus up to one
HEARTBEAT_IVL_MS (1 s). Each fault test prints the delay it measured, and bounds it by
DEAD_WITHIN_S only to tell a slow detection from a hang. To stay within the suite's time, the
kill -9 is checked through the API (503) and the cut link through LLM.generate: the executor
reports both the same way, and both front ends hear a dead engine core the same way
(tests/test_server_faults.py, tests/test_executor.py on one host).
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

from minivllm import envs
from minivllm.utils import netns_cluster
from minivllm.utils.netns_cluster import NetnsCluster

pytestmark = pytest.mark.skipif(netns_cluster.unavailable() is not None,
                                reason=str(netns_cluster.unavailable()))
DRIVER = os.path.join(os.path.dirname(__file__), "multinode_driver.py")
PORT = 29501  # each cluster has its own network: no other program holds it there
DEAD_WITHIN_S = 60.0  # a hang check; the measured delay is printed (a few ms / ~4 s)
RUN_TIMEOUT_S = 240.0
DELAY_MS = 1.0  # every host's sends, for the second answer


@pytest.fixture
def cluster():
    with NetnsCluster(3) as c:
        yield c


def engine_flags(c: NetnsCluster) -> list[str]:
    return ["-tp", "3", "--nnodes", "3", "--master-addr", c.addresses[0], "--master-port",
            str(PORT), "--num-threads", "1"]


def engine_args(c: NetnsCluster, model: str | None) -> dict:
    return dict(model=model, tensor_parallel_size=3, nnodes=3, master_addr=c.addresses[0],
                master_port=PORT, num_threads=1)


def start_headless(c: NetnsCluster, model: str | None,
                   env=lambda i: None) -> list[subprocess.Popen]:
    args = [sys.executable, "-m", "minivllm.cli", "serve", *([model] if model else []),
            "--headless", *engine_flags(c)]
    return [c.popen(i, args + ["--node-rank", str(i)], env=env(i), stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT, text=True) for i in (1, 2)]


def start_leader(c: NetnsCluster, mode: str, model: str | None, **kwargs) -> subprocess.Popen:
    return c.popen(0, [sys.executable, DRIVER, mode, json.dumps(engine_args(c, model))],
                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kwargs)


def last_json(out: str) -> dict:
    """The last JSON report the driver printed. Others write to the same output (stderr is
    merged into it; Ray forwards its workers' lines from a thread), and such a line can land
    between print's text and its newline: decode the object, ignore what follows it."""
    line = [line for line in out.splitlines() if line.startswith("{")][-1]
    return json.JSONDecoder().raw_decode(line)[0]


def finish(c: NetnsCluster, procs: list[subprocess.Popen]) -> list[str]:
    """Wait for every process (the headless nodes end when the leader does); then nothing may
    be left on any host: no process, no /dev/shm segment, no file in its TMPDIR."""
    outs = [p.communicate(timeout=RUN_TIMEOUT_S)[0] for p in procs]
    for i in range(len(c.hosts)):
        assert c.leftovers(i) == [], f"host {i} kept {c.leftovers(i)}"
    return outs


def test_tp3_across_three_hosts_answers_with_one_hosts_tokens_also_with_the_link_delayed(
        one_host_tp3_tokens):
    """One engine over three hosts answers twice: then every host's sends wait DELAY_MS (tc
    netem, or the userspace wire where the kernel has no netem: utils/netns_cluster.py), each
    hop between ranks is delayed, and the tokens stay the same."""
    with NetnsCluster(3, delay_by=netns_cluster.delay_method()) as c:
        nodes = start_headless(c, None)
        leader = start_leader(c, "generate_per_line", None, stdin=subprocess.PIPE)
        first = next_json_line(leader)
        c.set_delay(DELAY_MS)
        print(f"second answer with every host's sends delayed {DELAY_MS} ms by {c.delay_by}")
        leader.stdin.write("again\n")
        out, *node_outs = finish(c, [leader] + nodes)
    for result in (json.loads(first), last_json(out)):
        assert "Paris" in result["text"], first + out[-2000:]
        assert result["tokens"] == one_host_tp3_tokens
    assert len([line for line in out.splitlines() if line.startswith("{")]) == 1, out[-2000:]
    assert [n.returncode for n in nodes] == [0, 0], node_outs


def next_json_line(proc: subprocess.Popen) -> str:
    """The next line of proc's output that starts with "{" (its logs come first)."""
    seen = []
    for line in proc.stdout:
        if line.startswith("{"):
            return line
        seen.append(line)
    pytest.fail("no JSON line before the end of the output:\n" + "".join(seen)[-3000:])


def remote_worker(node: subprocess.Popen) -> psutil.Process:
    (worker,) = [p for p in psutil.Process(node.pid).children() if "Worker" in p.name()
                 or "Worker" in " ".join(p.cmdline())]
    return worker


def wait_until_generating(leader: subprocess.Popen) -> None:
    """Read the driver's output (tests/multinode_driver.py) up to its "generating" line."""
    for line in leader.stdout:
        if line.strip() == "generating":
            return
    pytest.fail("the leader never started generating")


def run_until_fault(c: NetnsCluster, model: str, fault, env=lambda i: None,
                    after=lambda nodes: None) -> tuple[str, float]:
    """Start the three hosts (host i with env(i)), wait until the leader generates, inject
    fault(nodes), and return the leader's output and the seconds from the fault to
    EngineDeadError; after(nodes) runs once the leader has failed."""
    nodes = start_headless(c, model, env)
    leader = start_leader(c, "until_dead", model, env=env(0))
    wait_until_generating(leader)
    fault(nodes)
    faulted = time.time()
    try:
        out = leader.communicate(timeout=DEAD_WITHIN_S)[0]
    except subprocess.TimeoutExpired:
        pytest.fail(f"LLM.generate did not fail within {DEAD_WITHIN_S:g} s of the fault")
    report = last_json(out)
    assert report["error"], out
    after(nodes)
    for node in nodes:  # the survivor hears the leader leave; the cut one by its heartbeat
        node.communicate(timeout=RUN_TIMEOUT_S)
    finish(c, [])
    return out, report["dead_at"] - faulted


def test_a_remote_hosts_link_going_down_fails_generate_within_the_heartbeat(cluster, tiny_dir):
    out, delay = run_until_fault(cluster, tiny_dir, lambda nodes: cluster.link_down(2))
    print(f"remote link down -> EngineDeadError in {delay:.2f} s")
    assert "(on node 2) is lost" in out and "closed or fell silent" in out


def test_a_stopped_remote_worker_fails_the_step_after_vllm_execute_model_timeout_seconds(
        cluster, tiny_dir):
    """A remote rank that hangs (SIGSTOP: its connections stay open) is caught by the step's
    deadline, VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS, here with the heartbeat set far above it so
    the deadline is what fires. Each node advertises the address VLLM_HOST_IP names."""
    def env(i: int) -> dict[str, str]:
        return {envs.EXECUTE_MODEL_TIMEOUT_ENV: "3", envs.HEARTBEAT_TIMEOUT_ENV: "600000",
                envs.HOST_IP_ENV: cluster.addresses[i]}

    stopped = []
    out, delay = run_until_fault(
        cluster, tiny_dir, lambda nodes: stopped.append(stop(remote_worker(nodes[1]))), env,
        after=lambda nodes: stopped[0].kill())  # the step gave up on it; the test ends it
    print(f"remote worker stopped -> EngineDeadError in {delay:.2f} s "
          f"({envs.EXECUTE_MODEL_TIMEOUT_ENV}=3)")
    assert f"did not reply within 3 s (the deadline of the whole call, " \
           f"{envs.EXECUTE_MODEL_TIMEOUT_ENV})" in out, out[-3000:]


def stop(proc: psutil.Process) -> psutil.Process:
    proc.send_signal(signal.SIGSTOP)
    return proc


def test_kill_9_of_a_remote_worker_makes_the_api_answer_503(cluster, tiny_dir):
    """`minivllm serve` on host 0 with its ranks on three hosts; an HTTP client on host 1."""
    url = f"http://{cluster.addresses[0]}:8000"
    nodes = start_headless(cluster, tiny_dir)
    server = cluster.popen(0, [sys.executable, "-m", "minivllm.cli", "serve", tiny_dir,
                               "--host", cluster.addresses[0], "--port", "8000",
                               *engine_flags(cluster)],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    client = cluster.popen(1, [sys.executable, DRIVER, "probe", json.dumps({"url": url})],
                           stdout=subprocess.PIPE, text=True)
    assert client.stdout.readline().strip() == "streaming"
    remote_worker(nodes[1]).send_signal(signal.SIGKILL)
    killed = time.time()
    report = last_json(client.communicate(timeout=DEAD_WITHIN_S)[0])
    out, *_ = finish(cluster, [server] + nodes)
    print(f"remote kill -9 -> /health {report['statuses']} in "
          f"{(report['at'] - killed) * 1000:.0f} ms")
    assert "503" in report["statuses"], (report, out[-3000:])
    assert '"error"' in report["last_events"][0] and report["last_events"][-1] == "[DONE]"
    assert server.returncode != 0 and "worker 2 (on node 2) is lost" in out
