"""Progress bars: a widget in Jupyter, a text bar on a terminal.

    from minivllm.utils.progress import tqdm

tqdm.auto falls back to its text bar in a Jupyter kernel without ipywidgets, with a TqdmWarning,
and every redraw of that bar arrives in the notebook as one more stderr line. Here, in a kernel,
the bar is tqdm's widget when ipywidgets is installed (requirements.txt pins it) and no bar at
all when it is not; anywhere else it is tqdm's ordinary text bar on stderr.
"""

from __future__ import annotations

import sys

from tqdm import tqdm as text_tqdm


def _in_kernel() -> bool:
    """True inside a Jupyter kernel (IPython with a kernel attached), not in a terminal IPython."""
    if "ipykernel" not in sys.modules:
        return False
    from IPython import get_ipython
    shell = get_ipython()
    return shell is not None and hasattr(shell, "kernel")


class _NoBarInKernel(text_tqdm):
    """A kernel without ipywidgets: the text bar would flood the notebook, so there is none."""

    def __init__(self, *args, **kwargs):
        kwargs["disable"] = True
        super().__init__(*args, **kwargs)


def _choose() -> type[text_tqdm]:
    if not _in_kernel():
        return text_tqdm
    try:
        import ipywidgets  # noqa: F401  (tqdm.notebook needs it to draw)
        from tqdm.notebook import tqdm as widget_tqdm
    except ImportError:
        return _NoBarInKernel
    return widget_tqdm


tqdm = _choose()
