"""Progress bars: tqdm's text bar on a terminal; in a Jupyter kernel a widget (ipywidgets
installed) or nothing, never a stream of stderr redraws with a TqdmWarning."""

import importlib.util
import subprocess
import sys

import nbformat
from nbclient import NotebookClient

BAR_CELL = ("from minivllm.utils.progress import tqdm\n"
            "for _ in tqdm(range(200), desc='cells'):\n    pass")
WIDGET = "application/vnd.jupyter.widget-view+json"


def test_a_terminal_gets_the_text_bar():
    run = subprocess.run([sys.executable, "-c", BAR_CELL], capture_output=True, text=True,
                         timeout=60, check=True)
    assert "cells: 100%" in run.stderr, f"no text bar on stderr: {run.stderr[-300:]!r}"


def test_a_kernel_gets_a_widget_or_no_bar():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(BAR_CELL)])
    NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    outputs = nb.cells[0].outputs
    stderr = [o.get("text", "") for o in outputs if o.get("name") == "stderr"]
    assert not stderr, f"the bar wrote to the notebook's stderr: {stderr[:3]}"
    widgets = [o for o in outputs if WIDGET in o.get("data", {})]
    if importlib.util.find_spec("ipywidgets"):
        assert widgets, "ipywidgets is installed, yet the kernel drew no widget bar"
    else:
        assert not widgets
