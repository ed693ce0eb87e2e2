"""Run folders outlive no owner: a terminated owner (SIGTERM, as a Jupyter kernel is shut down)
stops its children and removes its folder, and the next owner sweeps the folders of owners
that were SIGKILLed. Nothing of another prefix, or of a live owner, is touched."""

import os
import shutil
import signal
import subprocess
import sys
import tempfile

import nbformat
import psutil
from nbclient import NotebookClient

from minivllm.utils.resource_names import resource_prefix
from minivllm.utils.run_dir import (OWNER_FILE, RUN_DIR_ENV, _owner_alive, run_dir,
                                    start_ticks)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCH_CELL = """
import os
import tests.test_mp as t
from minivllm.utils import mp
child = mp.launch(t.echo_ready, "child", args=(1,))
print(os.environ["MINIVLLM_RUN_DIR"], child.pid, flush=True)
"""


def fresh_env() -> dict:
    return {k: v for k, v in os.environ.items() if k != RUN_DIR_ENV}  # a run of its own


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def gone(pid: int) -> bool:
    return not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_a_new_owner_sweeps_the_folders_of_dead_owners_and_nothing_else():
    tmp = tempfile.gettempdir()
    dead = tempfile.mkdtemp(prefix=f"{resource_prefix()}-run{dead_pid()}-", dir=tmp)
    alive = tempfile.mkdtemp(prefix=f"{resource_prefix()}-run{os.getpid()}-", dir=tmp)
    other = tempfile.mkdtemp(prefix=f"someone-else-run{dead_pid()}-", dir=tmp)
    subprocess.run([sys.executable, "-c", "from minivllm.utils.run_dir import run_dir; run_dir()"],
                   env=fresh_env(), check=True, cwd=ROOT)
    assert not os.path.exists(dead), "the folder of a dead owner was not swept"
    assert os.path.isdir(alive), "the folder of a live owner was removed"
    assert os.path.isdir(other), "a folder of another prefix was removed"
    os.rmdir(alive), os.rmdir(other)


def test_an_owner_pid_reused_by_another_process_is_a_dead_owner():
    """A SIGKILLed owner's pid, given by the kernel to another process, does not keep the
    folder: the folder records its owner's start time, and the new process has another."""
    later = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    folder = tempfile.mkdtemp(prefix=f"{resource_prefix()}-run{later.pid}-")
    try:
        record = os.path.join(folder, OWNER_FILE)
        with open(record, "w") as f:
            f.write(str(start_ticks(later.pid) - 1))  # the owner that died, a tick earlier
        assert not _owner_alive(later.pid, folder), "a reused pid counts as the owner"
        subprocess.run([sys.executable, "-c",
                        "from minivllm.utils.run_dir import run_dir; run_dir()"],
                       env=fresh_env(), check=True, cwd=ROOT)
        assert not os.path.exists(folder), "the sweep kept a reused pid's folder"
        os.makedirs(folder)
        with open(record, "w") as f:
            f.write(str(start_ticks(later.pid)))
        assert _owner_alive(later.pid, folder), "the live owner that made it is not alive"
        assert not _owner_alive(dead_pid(), folder)
    finally:
        later.kill()
        later.wait()
        shutil.rmtree(folder, ignore_errors=True)


def test_a_terminated_owner_stops_its_children_and_removes_its_folder():
    owner = subprocess.Popen([sys.executable, "-c", LAUNCH_CELL + "import time; time.sleep(60)"],
                             stdout=subprocess.PIPE, text=True, env=fresh_env(), cwd=ROOT)
    folder, pid = owner.stdout.readline().split()
    owner.stdout.close()
    assert os.path.isdir(folder)
    owner.send_signal(signal.SIGTERM)
    assert owner.wait(timeout=30) == -signal.SIGTERM, "the owner must still die of SIGTERM"
    assert gone(int(pid)), "the owner's child outlived it"
    assert not os.path.exists(folder), f"{folder} outlived its terminated owner"


def test_a_notebook_kernel_that_started_a_child_leaves_no_run_folder():
    """jupyter_client shuts a kernel down with a request, then SIGTERM: neither may leave the
    folder (five chapters left one each before)."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(LAUNCH_CELL)], metadata={
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    NotebookClient(nb, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": ROOT}}).execute(env=fresh_env())
    folder, pid = nb.cells[0].outputs[0]["text"].split()
    assert gone(int(pid)), "the kernel's child outlived the kernel"
    assert not os.path.exists(folder), f"the kernel left {folder}"
