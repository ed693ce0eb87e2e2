"""Progress bars: tqdm's text bar on a terminal; in a Jupyter kernel one display output that
each redraw replaces, so the saved notebook (a headless run, the book) shows the bar's last
state, never a stale 0% and never a stream of stderr redraws with a TqdmWarning."""

import subprocess
import sys

import nbformat
from nbclient import NotebookClient

BAR_CELL = ("from minivllm.utils.progress import tqdm\n"
            "for _ in tqdm(range(200), desc='cells'):\n    pass")
UNFINISHED_CELL = ("from minivllm.utils.progress import tqdm\n"
                   "with tqdm(total=10, desc='stopped', leave=False) as bar:\n    bar.update(4)")


def test_a_terminal_gets_the_text_bar():
    run = subprocess.run([sys.executable, "-c", BAR_CELL], capture_output=True, text=True,
                         timeout=60, check=True)
    assert "cells: 100%" in run.stderr, f"no text bar on stderr: {run.stderr[-300:]!r}"


def saved_outputs(*cells: str) -> list[list[dict]]:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    return [c.outputs for c in nb.cells]


def shown_text(outputs: list[dict]) -> list[str]:
    return [o["data"]["text/plain"] for o in outputs if "text/plain" in o.get("data", {})]


def test_a_kernel_saves_the_bar_at_its_final_state():
    finished, unfinished = saved_outputs(BAR_CELL, UNFINISHED_CELL)
    for outputs in (finished, unfinished):
        stderr = [o.get("text", "") for o in outputs if o.get("name") == "stderr"]
        assert not stderr, f"the bar wrote to the notebook's stderr: {stderr[:3]}"
    shown = shown_text(finished)
    assert len(shown) == 1 and "cells: 100%" in shown[0] and "200/200" in shown[0], (
        f"the saved output is not the finished bar: {shown}")
    shown = shown_text(unfinished)
    assert len(shown) == 1 and "stopped:  40%" in shown[0] and "4/10" in shown[0], (
        f"a bar erased at close (leave=False) must still show where it stopped: {shown}")
