"""The engine core in its own process, through real sockets: death, garbage, signals, start-up.

Every test starts real engine core processes on the tiny model; the autouse leak check then
proves that no process, /dev/shm segment or ipc socket file is left behind.
"""

import gc
import json
import os
import signal
import subprocess
import sys
import threading
import time
import weakref

import msgspec
import numpy as np
import psutil
import pytest
from tiny_model import make_tiny_model_dir

from minivllm import LLM
from minivllm.engine.config import EngineConfig
from minivllm.engine.core_client import InprocClient
from minivllm.engine.core_client_mp import SyncMPClient
from minivllm.engine.exceptions import EngineDeadError
from minivllm.engine.messages import EngineCoreRequest, EngineCoreRequestType, FinishReason
from minivllm.engine.launcher import launch_core_engines
from minivllm.sampling_params import SamplingParams
from minivllm.serial import MsgpackEncoder

RT = EngineCoreRequestType
DEATH_DEADLINE_S = 5.0  # the bound: a blocked caller learns of a death this fast
EXIT_WAIT_S = 60.0  # a clean exit is checked by its exit code, not its speed (linger, teardown)


def request(rid, n=10, first=3, **params):
    params = {"temperature": 0.0, "ignore_eos": True, "max_tokens": 16, **params}
    return EngineCoreRequest(rid, np.arange(first, first + n, dtype=np.int32),
                             SamplingParams(**params))


def run_until_finished(client, ids, on_output=None):
    """Drive get_output until every id in `ids` finished; returns id -> (tokens, last output)."""
    tokens, last = {i: [] for i in ids}, {}
    while len(last) < len(ids):
        outputs = client.get_output()
        for out in outputs.outputs:
            if out.request_id in tokens:
                tokens[out.request_id] += out.new_token_ids
                if out.finished:
                    last[out.request_id] = out
        if on_output is not None:
            on_output(outputs)
    return {i: (tokens[i], last[i]) for i in ids}


def wait_until_running(client, deadline_s=30.0):
    end = time.monotonic() + deadline_s
    while client.call_utility("get_stats")["num_running"] == 0:
        assert time.monotonic() < end, "the engine never started running the requests"
        time.sleep(0.02)


def test_kill_9_during_generate_raises_engine_dead_error_within_5_s(tiny_dir):
    llm = LLM(tiny_dir)
    pid = llm.engine_core.engine_manager.pids[0]
    caught = {}

    def generate():
        try:
            llm.generate(["The capital"] * 8, SamplingParams(max_tokens=1000, ignore_eos=True),
                         use_tqdm=False)
        except EngineDeadError as e:
            caught["error"], caught["at"] = e, time.monotonic()

    caller = threading.Thread(target=generate)
    caller.start()
    try:
        wait_until_running(llm.engine_core)
        killed_at = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        caller.join(DEATH_DEADLINE_S + 5)
        assert not caller.is_alive(), "the caller of generate() is still blocked"
        assert "error" in caught, "generate() returned instead of raising EngineDeadError"
        assert caught["at"] - killed_at < DEATH_DEADLINE_S
        assert "exit code -9" in str(caught["error"])
        with pytest.raises(EngineDeadError):  # and every later call, at once
            llm.generate("again", use_tqdm=False)
        with pytest.raises(EngineDeadError):
            llm.engine_core.call_utility("get_stats")
    finally:
        llm.close()
    assert not llm.engine_core.engine_manager.handles[0].is_alive()


def test_an_exception_inside_step_reaches_the_caller_as_engine_dead_error(tiny_dir):
    """The fault is injected into Scheduler.update_from_output in a fresh interpreter that then
    forks the engine core (a fork inherits the patch; this pytest process may already run
    torch's OpenMP pool, in which a forked engine would hang)."""
    out = subprocess.run([sys.executable, __file__, "fault-in-step", tiny_dir],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["error_type"] == "EngineDeadError", result
    assert "reported a fatal error" in result["error"]  # ENGINE_CORE_DEAD, not just the exit
    fault_at = float(out.stderr.split("FAULT_AT ")[1].split()[0])
    assert result["caught_at"] - fault_at < DEATH_DEADLINE_S
    assert result["exitcode"] == 1
    assert "injected fault in step()" in out.stderr  # the engine's traceback is in its log


def _fault_in_step_main(model_dir: str) -> None:
    import multiprocessing

    from minivllm.engine import launcher
    from minivllm.engine.scheduler import Scheduler

    # Fork, so the engine inherits the patch: safe here, this interpreter never ran the model
    # (start_context would pick spawn for the tokenizer's threads, and lose the patch).
    launcher.start_context = lambda: multiprocessing.get_context("fork")
    original, calls = Scheduler.update_from_output, [0]

    def failing(self, *args):
        calls[0] += 1
        if calls[0] == 10:
            print(f"FAULT_AT {time.time()!r}", file=sys.stderr, flush=True)
            raise RuntimeError("injected fault in step()")
        return original(self, *args)

    Scheduler.update_from_output = failing
    llm = LLM(model_dir)
    try:
        llm.generate(["The capital"] * 4, SamplingParams(max_tokens=500, ignore_eos=True),
                     use_tqdm=False)
        result = {"error_type": None, "error": ""}
    except Exception as e:  # noqa: BLE001 - reported to the test
        result = {"error_type": type(e).__name__, "error": str(e)}
    finally:
        caught_at = time.time()  # wall clock: comparable with the engine's FAULT_AT
        llm.close()
    result["caught_at"] = caught_at
    result["exitcode"] = llm.engine_core.engine_manager.handles[0].process.exitcode
    print(json.dumps(result))


def malformed_frames(count, keep_id, rng):
    """Garbage of every kind the issue names, as [type frame, body frames...] lists."""
    enc = MsgpackEncoder()
    kinds = [
        lambda i: [rng.bytes(int(rng.integers(1, 20)))],  # random bytes, no valid type
        lambda i: [b"\x09", rng.bytes(8)],  # a type byte that does not exist
        lambda i: [b""],  # an empty type frame
        lambda i: [RT.ABORT.value, *enc.encode([f"no-such-request-{i}"])],  # unknown abort
        lambda i: [RT.ADD.value, *enc.encode(EngineCoreRequest(  # token ids out of range
            f"bad-{i}", np.array([3, 10**6], np.int32), SamplingParams()))],
        lambda i: [RT.ADD.value, *enc.encode(request(keep_id, 5))],  # duplicate running id
        lambda i: [RT.ADD.value, rng.bytes(30)],  # an ADD body that is not msgpack
        lambda i: [RT.ADD.value, msgspec.msgpack.encode([f"bad-{i}", "not tokens"])],
        lambda i: [RT.UTILITY.value, rng.bytes(12)],
        lambda i: [RT.EXECUTOR_FAILED.value],  # the engine's own message, from a client
        lambda i: [RT.ABORT.value, msgspec.msgpack.encode({"not": "a list"})],
    ]
    return [kinds[i % len(kinds)](i) for i in range(count)]


def test_a_thousand_malformed_frames_do_not_disturb_a_generation(tiny_dir):
    config = EngineConfig(model=tiny_dir)
    ids = ["a", "b", "c"]
    reference_client = InprocClient(config)
    try:
        for i, rid in enumerate(ids):
            reference_client.add_request(request(rid, 6 + 5 * i, max_tokens=48))
        reference = run_until_finished(reference_client, ids)
    finally:
        reference_client.shutdown()
    client = SyncMPClient(config)
    try:
        client.add_request(request("keep", 7, max_tokens=1000))  # runs through all the garbage
        for i, rid in enumerate(ids):
            client.add_request(request(rid, 6 + 5 * i, max_tokens=48))
        garbage = malformed_frames(1000, "keep", np.random.default_rng(0))
        errors, identity = {}, client.core_engines[0]

        def flood(outputs):
            for out in outputs.outputs:
                if out.finish_reason == FinishReason.ERROR:
                    errors[out.request_id] = out.stop_reason or out.error
            for frames in garbage[:40]:
                client.input_socket.send_multipart([identity, *frames])
            del garbage[:40]

        got = run_until_finished(client, ids, on_output=flood)
        assert not garbage, "the generation ended before all 1,000 frames were sent"
        for rid in ids:
            assert got[rid][0] == reference[rid][0], f"request {rid} changed under the garbage"
            assert got[rid][1].finish_reason == FinishReason.LENGTH
        client.abort_requests(["keep"])
        # the engine still answers: a new request, and its books are clean
        client.add_request(request("after", 9, max_tokens=5))
        after = run_until_finished(client, ["after"], on_output=flood)
        assert len(after["after"][0]) == 5
        stats = client.call_utility("get_stats")
        assert stats["num_running"] == stats["num_waiting"] == stats["kv_blocks_used"] == 0
        assert errors and all(k.startswith("bad-") for k in errors)  # refused ids were told why
        assert any("token ids" in e for e in errors.values())
    finally:
        client.shutdown()


def test_data_parallel_routes_to_the_least_loaded_and_aborts_follow(tiny_dir):
    client = SyncMPClient(EngineConfig(model=tiny_dir, data_parallel_size=2))
    try:
        for i in range(4):
            client.add_request(request(f"r{i}", 8, first=3 + i, max_tokens=1000))
        assert [client.reqs_in_flight[f"r{i}"] for i in range(4)] == [0, 1, 0, 1]
        client.abort_requests(["r1", "r3"])  # both on engine 1
        # utility calls queue behind the ABORTs in each engine: the answer is deterministic
        stats = client.call_utility_all("get_stats")
        assert [s["num_running"] + s["num_waiting"] for s in stats] == [2, 0]
        assert stats[1]["kv_blocks_used"] == 0
        client.add_request(request("r4", 8, max_tokens=1000))  # engine 1 is the least loaded
        assert client.reqs_in_flight["r4"] == 1
        with pytest.raises(RuntimeError, match="unknown utility"):
            client.call_utility("shutdown")
        # collective_rpc reaches the executor's workers, in each engine
        threads = client.call_utility_all("collective_rpc", "get_num_threads")
        assert len(threads) == 2 and all(len(t) == 1 and t[0] >= 1 for t in threads)
        with pytest.raises(RuntimeError, match="no public method"):
            client.call_utility("collective_rpc", "_private")
        client.abort_requests(["r0", "r2", "r4"])
        assert client.in_flight == [0, 0]
    finally:
        client.shutdown()


def test_one_engine_serves_two_clients_each_its_own_outputs(tiny_dir):
    """As with `minivllm serve --api-server-count 2`: a launcher starts the engine, two clients
    (API servers) connect to it, each with its own ROUTER/PULL and client_index."""
    config = EngineConfig(model=tiny_dir)
    manager, addresses = launch_core_engines(config, num_api_servers=2)
    clients = []
    try:
        for i in range(2):
            clients.append(SyncMPClient(config, addresses.for_client(i, manager.pids),
                                        client_index=i))
        for i, client in enumerate(clients):
            client.add_request(request(f"c{i}", 8, first=3 + i, max_tokens=5))
        for i, client in enumerate(clients):
            got = run_until_finished(client, [f"c{i}"])
            assert len(got[f"c{i}"][0]) == 5
        assert all(c.outputs_queue.empty() for c in clients)  # nobody got the other's outputs
        os.kill(manager.pids[0], signal.SIGKILL)  # clients that did not start the engine...
        for client in clients:  # ...see its death through the pidfds
            with pytest.raises(EngineDeadError):
                client.get_output()
    finally:
        for client in clients:
            client.shutdown()
        manager.close()


def test_sigterm_aborts_what_runs_and_exits_cleanly(tiny_dir):
    client = SyncMPClient(EngineConfig(model=tiny_dir))
    try:
        client.add_request(request("long", 8, max_tokens=1000))
        wait_until_running(client)
        handle = client.engine_manager.handles[0]
        os.kill(handle.pid, signal.SIGTERM)
        aborted = run_until_finished(client, ["long"])["long"][1]
        assert aborted.finish_reason == FinishReason.ABORT and "shut down" in aborted.error
        assert handle.exit_code(timeout=EXIT_WAIT_S) == 0  # the death monitor reaps it too
        with pytest.raises(EngineDeadError, match="exit code 0"):
            client.get_output()
    finally:
        client.shutdown()


def test_a_start_up_failure_is_reported_with_the_engines_traceback(tiny_dir, tmp_path):
    broken = make_tiny_model_dir(str(tmp_path / "broken"))
    with open(os.path.join(broken, "model.safetensors"), "r+b") as f:
        f.truncate(100)  # config.json is fine (the front end reads it); the weights are not
    with pytest.raises(RuntimeError, match="engine core 0 failed during start-up"):
        SyncMPClient(EngineConfig(model=broken))


def test_a_dropped_llm_stops_its_engine_like_close(tiny_dir):
    """Re-running `llm = LLM(...)` in a notebook drops the old LLM: its engine core must stop,
    and its client threads (which hold it only weakly) end, once it is collected."""
    llm = LLM(tiny_dir)
    assert llm.generate("The capital", SamplingParams(max_tokens=2), use_tqdm=False)
    handle = llm.engine_core.engine_manager.handles[0]
    threads = list(llm.engine_core.resources.threads)
    ref = weakref.ref(llm.engine_core)
    del llm
    gc.collect()
    assert ref() is None, f"something still holds the client: {gc.get_referrers(ref())}"
    assert handle.exit_code(timeout=EXIT_WAIT_S) == 0  # asked to stop, not killed
    for t in threads:
        t.join(EXIT_WAIT_S)
        assert not t.is_alive(), f"{t.name} outlived its client"


def test_an_engine_not_ready_in_time_is_stopped_with_an_error_that_says_which(tiny_dir):
    """READY needs the addresses first, then the model: with no time allowed for the model,
    the launcher must raise at once, naming the engine, and stop the process it started."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(TimeoutError, match=r"engine core\(s\) \[0\] have not reported READY "
                       r"\(loading the model\) within 0 s: .*larger ready_timeout"):
        launch_core_engines(EngineConfig(model=tiny_dir), ready_timeout=0.0)
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    assert not [p for p in left if p.is_running() and p.status() != psutil.STATUS_ZOMBIE], left


if __name__ == "__main__":
    if sys.argv[1] == "fault-in-step":
        _fault_in_step_main(sys.argv[2])
