"""Shared fixtures. `no_leaks` runs around every test: a test that leaves a child process,
a /dev/shm segment or an ipc socket file behind fails, and the leftovers are removed.

Each test gets its own resource prefix (MINIVLLM_RESOURCE_PREFIX) and its own TMPDIR, so the
check blames only what the test made, never what another program made meanwhile."""

import itertools
import multiprocessing.resource_tracker
import os
import re
import shutil
import tempfile
import warnings

import pytest
from tiny_model import make_tiny_model_dir

from minivllm.model import csrc_build, op_choice
from minivllm.utils.leaks import Snapshot, become_subreaper, reap_orphans
from minivllm.utils.resource_names import PREFIX_ENV, name_default_segments

os.environ.setdefault("MINIVLLM_QUICK", "1")
# Python's resource tracker is started lazily by the first spawn or SharedMemory and then lives
# as long as pytest; start it now so that it is part of every test's "before".
multiprocessing.resource_tracker.ensure_running()
become_subreaper()  # a test's process that double-forks comes back to pytest, to be found
name_default_segments()  # SharedMemory(create=True) without a name gets the test's prefix
_test_ids = itertools.count()
TEST_PREFIX = "minivllm-t"  # + pytest's pid + "x" + the test's number: each test's own names


# The longest files first, so that `pytest -n 2` (make test) starts them at once: the exercise
# checks (587 grades in 6 processes of their own, mostly waiting: 650 s) beside the chapters.
# tests/test_book.py runs last: its build reuses the chapters test_chapters.py executed.
ORDER = {"test_exercises.py": 0, "test_chapters.py": 1, "test_book.py": 3}
# Under pytest-xdist each file goes to one worker (--dist loadfile, as the Makefile asks), and
# test_book.py to the worker that runs test_chapters.py, after it.
SAME_WORKER = {"test_book.py": "test_chapters.py"}


def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: ORDER.get(item.path.name, 2))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class ChaptersThenBook(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            folder, _, name = path.rpartition("/")
            return f"{folder}/{SAME_WORKER[name]}" if name in SAME_WORKER else path

    return ChaptersThenBook(config, log)


@pytest.fixture(scope="session", autouse=True)
def _basetemp(tmp_path_factory):
    """Fix pytest's tmp_path root in the real temp dir, before any test's private TMPDIR."""
    tmp_path_factory.getbasetemp()


@pytest.fixture
def c_ops():
    """Every op in C, whatever this CPU's measurements chose (op_selection.py)."""
    if csrc_build.load() is None:
        pytest.skip("the C ops are not built here")
    chosen = op_choice.set_table("c")
    yield
    op_choice.set_table(chosen)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> str:
    """A tiny random-weight Llama (tiny_model.py) for tests that need speed, not text: built
    once per run and only read."""
    return make_tiny_model_dir(str(tmp_path_factory.mktemp("tiny")))


@pytest.fixture(scope="session")
def tiny_dir_tp2(tmp_path_factory) -> str:
    """The tiny model with 2 KV heads: tensor parallelism splits it 2 ways."""
    return make_tiny_model_dir(str(tmp_path_factory.mktemp("tiny_tp2")), num_kv_heads=2)


@pytest.fixture(scope="session")
def one_host_tp3_tokens() -> list[int]:
    """Greedy tokens of tests/multinode_driver.py's QUESTION from TP=3 on one host (mp
    backend: shm ring, loopback gloo): what every cross-host run (mp or Ray) must give.
    Made once per run, on first use."""
    from multinode_driver import QUESTION

    from minivllm.entrypoints.llm import LLM
    from minivllm.sampling_params import SamplingParams
    params = SamplingParams(temperature=0.0, max_tokens=8)
    with LLM(tensor_parallel_size=3, num_threads=1) as llm:
        return list(llm.chat(QUESTION, params, use_tqdm=False)[0].outputs[0].token_ids)


def _another_runs(path: str) -> bool:
    """A file named under another pytest process's test prefix (the other xdist worker, or a
    second run of the suite): that process checks and removes it, so it is not worth a word."""
    owners = {int(m[1]) for part in path.split("/")
              if (m := re.match(rf"{TEST_PREFIX}(\d+)x", part))}
    return bool(owners) and os.getpid() not in owners


@pytest.fixture(autouse=True)
def no_leaks(monkeypatch):
    prefix = f"{TEST_PREFIX}{os.getpid()}x{next(_test_ids)}"
    private = tempfile.mkdtemp(prefix=prefix + "-")  # short: ipc paths nest under it
    monkeypatch.setenv(PREFIX_ENV, prefix)
    monkeypatch.setenv("TMPDIR", private)
    monkeypatch.setattr(tempfile, "tempdir", private)
    reap_orphans()  # workers of an engine core killed by an earlier test, adopted since
    before = Snapshot(prefix, private_dirs=[private],
                      socket_roots=[(os.path.dirname(private), 1)])
    yield
    leaks = before.leaks()
    shutil.rmtree(private, ignore_errors=True)
    leaks.others = [path for path in leaks.others if not _another_runs(path)]
    if leaks.others:
        warnings.warn(leaks.warning())
    if leaks:
        pytest.fail("the test left resources behind:\n" + leaks.describe(), pytrace=False)
