"""MultiprocExecutor with three real worker processes on the tiny model: titles, collective_rpc
errors and deadlines, and deaths on both sides. Every test also runs under conftest's leak
check: no process, /dev/shm segment or ipc socket file may be left behind."""

import os
import signal
import threading
import time

import numpy as np
import psutil
import pytest

from minivllm.engine.config import EngineConfig
from minivllm.engine.core import EngineCore
from minivllm.engine.messages import EngineCoreRequest
from minivllm.executor.multiproc_executor import WorkerDiedError
from minivllm.sampling_params import SamplingParams
from minivllm.utils.mp import ChildLink, launch

DEATH_REPORTED_S = 5.0  # the bound: a worker's death reaches the caller within this
ORPHAN_EXIT_S = 15.0  # death pipe EOF + the workers' grace + their interpreter teardown


@pytest.fixture
def core(tiny_dir):
    core = EngineCore(EngineConfig(model=tiny_dir, tensor_parallel_size=3))
    yield core
    core.shutdown()


def worker_pids(core: EngineCore) -> list[int]:
    return [w.proc.pid for w in core.model_executor.workers]


def test_three_titled_worker_processes(core):
    pids = worker_pids(core)
    assert len(set(pids)) == 3 and os.getpid() not in pids
    titles = [psutil.Process(pid).cmdline()[0] for pid in pids]
    assert titles == [f"MINIVLLM::Worker_TP{r}" for r in range(3)]
    assert core.model_executor.collective_rpc("get_num_threads") == [
        max(1, len(os.sched_getaffinity(0)) // 3)] * 3


def test_collective_rpc_error_names_the_worker_and_the_engine_goes_on(core):
    with pytest.raises(RuntimeError, match=r"(?s)failed on worker 0 \(pid \d+\).*no public method"):
        core.model_executor.collective_rpc("no_such_method")
    with pytest.raises(RuntimeError, match="no public method '_init_'"):
        core.model_executor.collective_rpc("_init_")  # private names are refused too
    assert len(core.model_executor.collective_rpc("get_num_threads", timeout=30)) == 3


def test_deadline_names_the_stuck_worker_and_its_late_reply_is_dropped(core):
    """A stopped worker misses the call's one deadline; once it runs again, its late reply to
    that call must not be taken for the reply to the next call (call ids)."""
    pid = worker_pids(core)[1]
    os.kill(pid, signal.SIGSTOP)
    try:
        start = time.monotonic()
        with pytest.raises(TimeoutError, match=rf"worker 1 \(pid {pid}\) did not reply within 1 s"):
            core.model_executor.collective_rpc("get_num_threads", timeout=1.0)
        assert time.monotonic() - start < 3.0
    finally:
        os.kill(pid, signal.SIGCONT)
    ids = [5, 6, 7, 8]
    logits = core.model_executor.collective_rpc("score", (ids,), timeout=30)
    assert logits[0].shape == (4, core.config.model_config.vocab_size)
    assert logits[1] is None and logits[2] is None  # only the output rank gathers the logits


def test_kill_9_on_a_worker_during_generation_fails_the_caller_fast(core):
    calls = []
    core.model_executor.register_failure_callback(lambda: calls.append(time.monotonic()))
    params = SamplingParams(temperature=0.0, max_tokens=100_000, ignore_eos=True)
    for i in range(4):
        core.add_request(EngineCoreRequest(str(i), np.arange(3, 40, dtype=np.int32), params))
    victim = worker_pids(core)[2]
    killed = []

    def kill_soon():
        time.sleep(0.5)
        killed.append(time.monotonic())
        os.kill(victim, signal.SIGKILL)

    threading.Thread(target=kill_soon).start()
    with pytest.raises(WorkerDiedError, match=rf"worker 2 \(pid {victim}\) died \(signal SIGKILL\)"):
        while True:
            core.step()
    elapsed = time.monotonic() - killed[0]
    assert elapsed < DEATH_REPORTED_S, f"the death took {elapsed:.1f} s to reach the caller"
    # the callback comes right after the pending waits were failed, from the monitor thread
    deadline = time.monotonic() + DEATH_REPORTED_S
    while not calls and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(calls) == 1 and calls[0] - killed[0] < DEATH_REPORTED_S
    with pytest.raises(WorkerDiedError):  # and every later call fails at once
        core.model_executor.collective_rpc("get_num_threads", timeout=5)


def _engine_core_with_tp3(link: ChildLink, model: str) -> None:
    """A stand-in for the engine core process: an EngineCore with 3 workers, then idle."""
    core = EngineCore(EngineConfig(model=model, tensor_parallel_size=3))
    link.ready(worker_pids(core))
    link.wait_stop()
    core.shutdown()


def test_workers_exit_by_themselves_when_the_engine_core_is_killed(tiny_dir):
    """kill -9 on the process that owns the executor: each worker reads EOF on its death pipe,
    leaves its loop, and (a survivor) unlinks the broadcast ring and ipc files its dead
    creator left. The leak check then finds nothing."""
    handle = launch(_engine_core_with_tp3, "EngineCore_0", args=(tiny_dir,), ready_timeout=120)
    pids = handle.ready_message
    os.kill(handle.pid, signal.SIGKILL)
    handle.shutdown()
    deadline = time.monotonic() + ORPHAN_EXIT_S
    alive = pids
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [p for p in alive if psutil.pid_exists(p)
                 and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"workers {alive} still running {ORPHAN_EXIT_S:g} s after the engine core died"


# --- through the engine core process (LLM's default) -----------------------------------------
def _titled(prefix: str) -> list[psutil.Process]:
    found = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.cmdline() and p.cmdline()[0].startswith(prefix):
                found.append(p)
        except psutil.NoSuchProcess:
            pass
    return found


@pytest.fixture
def llm_tp3(tiny_dir, monkeypatch):
    from minivllm import LLM
    monkeypatch.delenv("MINIVLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    llm = LLM(tiny_dir, tensor_parallel_size=3)
    yield llm
    llm.close()


def test_kill_9_on_a_worker_reaches_the_llm_caller_as_engine_dead(llm_tp3):
    """worker death -> executor monitor -> EXECUTOR_FAILED -> ENGINE_CORE_DEAD -> the client."""
    from minivllm.engine.exceptions import EngineDeadError
    workers = _titled("MINIVLLM::Worker_TP")
    assert len(workers) == 3 and len(_titled("MINIVLLM::EngineCore")) == 1
    killed = []

    def kill_soon():
        time.sleep(1.0)
        killed.append(time.monotonic())
        os.kill(workers[1].pid, signal.SIGKILL)

    threading.Thread(target=kill_soon).start()
    params = SamplingParams(temperature=0.0, max_tokens=100_000, ignore_eos=True)
    with pytest.raises(EngineDeadError):
        llm_tp3.generate([[5, 6, 7]] * 4, params, use_tqdm=False)
    elapsed = time.monotonic() - killed[0]
    assert elapsed < DEATH_REPORTED_S, f"the death took {elapsed:.1f} s to reach the caller"


def test_kill_9_on_the_engine_core_and_its_workers_exit_by_themselves(llm_tp3):
    workers = _titled("MINIVLLM::Worker_TP")
    (engine,) = _titled("MINIVLLM::EngineCore")
    assert all(w.ppid() == engine.pid for w in workers)
    engine.kill()
    gone, alive = psutil.wait_procs(workers, timeout=ORPHAN_EXIT_S)
    assert not alive, f"workers {[p.pid for p in alive]} outlived their engine core"
