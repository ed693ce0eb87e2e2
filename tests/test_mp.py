"""minivllm.utils.mp with real processes: start-method choice, ready handshake, death pipe,
escalating shutdown; and the serve process count of vLLM's docs."""

import multiprocessing
import multiprocessing.connection
import multiprocessing.resource_tracker
import os
import signal
import sys
import subprocess
import threading
import time

import psutil
import pytest

from minivllm.utils import mp
from minivllm.utils.process_count import serve_process_count

CONTEXTS = ["fork", "spawn"]
# spawn starts multiprocessing's resource tracker once per test run and keeps it: start it
# before any test takes its leak snapshot, so that it is not counted as a leaked process.
multiprocessing.resource_tracker.ensure_running()
ORPHAN_EXIT_WAIT_S = 15.0  # generous: PARENT_DEATH_GRACE_S plus a loaded 2-core machine
BYSTANDER_S = 60.0  # a plain fork that outlives every wait below (the test kills it)


# --- child targets (module level, so spawn can import them) --------------------------------
def echo_ready(link, value):
    link.ready({"pid": os.getpid(), "value": value})
    link.wait_stop()


def fails_in_setup(link):
    raise ValueError("bad config: no model named 'nope'")


def never_ready(link):
    time.sleep(60)


def exits_early(link):
    os._exit(7)


def ignores_stop(link):
    link.ready()
    while True:
        time.sleep(0.05)  # SIGTERM's SystemExit unwinds this


def ignores_term(link):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    link.ready()
    while True:
        time.sleep(0.05)


def parent_of_two(link):
    """A middle process: launches two children and reports their pids."""
    kids = [mp.launch(echo_ready, f"kid{i}", args=(i,), ready_timeout=30) for i in range(2)]
    link.ready([k.pid for k in kids])
    while True:
        time.sleep(0.1)


def forks_a_bystander(link, with_kid):
    """A middle process that forks a plain child outside launch() (a bystander that sleeps),
    and optionally launches a kid first; reports [bystander pid, kid pid or None]."""
    kid = mp.launch(echo_ready, "kid", args=(0,), ready_timeout=30) if with_kid else None
    pid = os.fork()
    if pid == 0:
        time.sleep(BYSTANDER_S)
        os._exit(0)
    link.ready([pid, kid.pid if kid else None])
    while True:
        time.sleep(0.1)


def ctx(method):
    return multiprocessing.get_context(method)


# --- start method ---------------------------------------------------------------------------
def method_in_fresh_interpreter(env_value=None) -> str:
    """choose_start_method() where no earlier test left a thread running (tqdm's monitor...)."""
    env = {k: v for k, v in os.environ.items() if k != mp.START_METHOD_ENV}
    if env_value:
        env[mp.START_METHOD_ENV] = env_value
    code = "from minivllm.utils import mp; print(mp.choose_start_method()[0])"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True).stdout.strip()


def test_default_is_fork_and_env_var_overrides(monkeypatch):
    assert method_in_fresh_interpreter() == "fork"
    assert method_in_fresh_interpreter("spawn") == "spawn"
    monkeypatch.setenv(mp.START_METHOD_ENV, "forkserver")
    assert mp.choose_start_method() == ("forkserver", f"forkserver from {mp.START_METHOD_ENV}=forkserver")
    monkeypatch.setenv(mp.START_METHOD_ENV, "vfork")
    with pytest.raises(ValueError, match="choose one of"):
        mp.choose_start_method()


def test_a_running_thread_forces_spawn(monkeypatch):
    monkeypatch.setenv(mp.START_METHOD_ENV, "fork")
    stop = threading.Event()
    t = threading.Thread(target=stop.wait, name="busy-io")
    t.start()
    try:
        method, why = mp.choose_start_method()
        assert method == "spawn" and "busy-io" in why
        assert mp.get_mp_context().get_start_method() == "spawn"
    finally:
        stop.set()
        t.join()
    assert "busy-io" not in mp.choose_start_method()[1]


# --- launch and the handshake ---------------------------------------------------------------
@pytest.mark.parametrize("method", CONTEXTS)
def test_launch_returns_ready_message_and_shuts_down_politely(method):
    with mp.launch(echo_ready, "echo", args=(42,), context=ctx(method)) as h:
        assert h.ready_message["value"] == 42
        assert h.ready_message["pid"] == h.pid != os.getpid()
        assert h.is_alive()
    assert h.shutdown_how == "exited" and h.process.exitcode == 0
    assert h.shutdown() == "exited"  # idempotent


@pytest.mark.parametrize("method", CONTEXTS)
def test_error_in_setup_reaches_the_parent_with_the_traceback(method):
    with pytest.raises(mp.ChildStartError, match=r"setup \(pid \d+\) failed") as e:
        mp.launch(fails_in_setup, "setup", context=ctx(method))
    assert "bad config: no model named 'nope'" in str(e.value)


def test_ready_timeout_names_the_child_and_stops_it():
    start = time.monotonic()
    with pytest.raises(mp.ReadyTimeoutError, match=r"slowpoke \(pid \d+\) did not report ready within 0.5 s"):
        mp.launch(never_ready, "slowpoke", ready_timeout=0.5)
    assert time.monotonic() - start < 30  # stopped (by SIGTERM), not waited out
    assert not mp._LIVE


def test_child_dying_before_ready_reports_its_exit_code():
    with pytest.raises(mp.ChildStartError, match="exited with code 7 before it reported ready"):
        mp.launch(exits_early, "early", context=ctx("fork"))


def test_target_defined_in_main_fails_in_a_spawn_child_with_advice():
    main = sys.modules["__main__"]

    def only_in_parent(link):
        link.ready()
    only_in_parent.__module__, only_in_parent.__qualname__ = "__main__", "only_in_parent"
    main.only_in_parent = only_in_parent  # the parent finds it; a fresh interpreter does not
    try:
        with pytest.raises(mp.ChildStartError) as e:
            mp.launch(only_in_parent, "nb", context=ctx("spawn"), ready_timeout=30)
    finally:
        del main.only_in_parent
    assert "Can't get attribute 'only_in_parent'" in str(e.value)
    assert "importable module" in str(e.value)


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_a_script_piped_on_stdin_gets_one_clear_error_before_any_child_starts(method):
    """A spawn child re-runs '<stdin>', which it cannot open: one error that says what to do,
    not a FileNotFoundError traceback from each child."""
    script = ("from minivllm.utils import mp\n"
              "import tests.test_mp as t\n"
              f"mp.launch(t.echo_ready, 'worker', args=(1,), context=t.ctx({method!r}))\n")
    run = subprocess.run([sys.executable, "-"], input=script, capture_output=True, text=True,
                         timeout=120, cwd=os.path.dirname(os.path.dirname(__file__)))
    assert run.returncode != 0
    assert "ChildStartError: cannot start worker" in run.stderr, run.stderr
    assert "Save the script to a file" in run.stderr
    assert "FileNotFoundError" not in run.stderr, run.stderr


def test_lambda_cannot_be_sent_to_spawn():
    with pytest.raises(mp.ChildStartError, match="cannot send the target of lam"):
        mp.launch(lambda link: None, "lam", context=ctx("spawn"))


# --- shutdown escalates ---------------------------------------------------------------------
def test_shutdown_escalates_to_sigterm_then_sigkill():
    h1 = mp.launch(ignores_stop, "deaf", context=ctx("fork"))
    assert h1.shutdown(timeout=0.3) == "terminated"
    assert h1.process.exitcode == mp.EXIT_TERMINATED
    h2 = mp.launch(ignores_term, "stubborn", context=ctx("fork"))
    assert h2.shutdown(timeout=0.3, term_timeout=0.3) == "killed"
    assert h2.process.exitcode == -signal.SIGKILL


# --- the death pipe -------------------------------------------------------------------------
def _wait_gone(pids, timeout):
    deadline = time.monotonic() + timeout
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if psutil.pid_exists(p)
                 and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        time.sleep(0.1)
    return alive


@pytest.mark.parametrize("method", CONTEXTS)
def test_children_exit_by_themselves_when_their_parent_is_killed(method):
    middle = mp.launch(parent_of_two, "middle", context=ctx(method), ready_timeout=60)
    kids = middle.ready_message
    assert all(psutil.pid_exists(p) for p in kids)
    os.kill(middle.pid, signal.SIGKILL)  # no cleanup code runs in the middle process
    middle.process.join(10)
    alive = _wait_gone(kids, ORPHAN_EXIT_WAIT_S)
    for p in alive:  # do not leave them behind if the test fails
        os.kill(p, signal.SIGKILL)
    assert not alive, f"children {alive} outlived their SIGKILLed parent by {ORPHAN_EXIT_WAIT_S} s"
    assert middle.shutdown() == "exited"


def _kill(*pids):
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except (ProcessLookupError, TypeError):
            pass


@pytest.mark.parametrize("method", CONTEXTS)
def test_a_plain_fork_does_not_keep_a_child_alive_after_its_parent_is_killed(method):
    """The bystander, forked outside launch(), must not hold a copy of the kid's death pipe."""
    middle = mp.launch(forks_a_bystander, "middle", args=(True,), context=ctx(method),
                       ready_timeout=60)
    bystander, kid = middle.ready_message
    try:
        os.kill(middle.pid, signal.SIGKILL)
        alive = _wait_gone([kid], ORPHAN_EXIT_WAIT_S)
        assert not alive, "the kid outlived its SIGKILLed parent while a plain fork of it lived"
    finally:
        _kill(bystander, kid)
        middle.shutdown()


@pytest.mark.parametrize("method", CONTEXTS)
def test_a_childs_sentinel_fires_when_it_dies_not_when_its_forks_do(method):
    middle = mp.launch(forks_a_bystander, "middle", args=(False,), context=ctx(method),
                       ready_timeout=60)
    bystander, _ = middle.ready_message
    try:
        os.kill(middle.pid, signal.SIGKILL)
        fired = multiprocessing.connection.wait([middle.sentinel], ORPHAN_EXIT_WAIT_S)
        assert fired, f"the sentinel did not fire within {ORPHAN_EXIT_WAIT_S} s of SIGKILL"
        start = time.monotonic()
        assert middle.shutdown() == "exited"
        assert time.monotonic() - start < 5, "shutdown waited for the bystander"
    finally:
        _kill(bystander)


# --- the process count ----------------------------------------------------------------------
def test_process_count_matches_the_vllm_docs_examples():
    tp4 = serve_process_count(tp=4)  # `vllm serve -tp=4`: 1 + 1 + 4
    assert (tp4.api_servers, tp4.engine_cores, tp4.workers, tp4.total) == (1, 1, 4, 6)
    big = serve_process_count(tp=2, dp=4)  # `vllm serve -tp=2 -dp=4`: 1 launcher + 4 + 4 + 8 + 1
    assert (big.launcher, big.api_servers, big.engine_cores, big.workers, big.dp_coordinator) == (1, 4, 4, 8, 1)
    assert big.total == 18
    assert serve_process_count().total == 2  # TP=1: the worker lives in the engine core
    assert serve_process_count(tp=2, dp=2, api_server_count=1).total == 1 + 2 + 4 + 1
    assert "18 processes" in big.describe()
    with pytest.raises(ValueError):
        serve_process_count(tp=0)
