"""Progress bars: tqdm's text bar, on stderr in a terminal, as one output line in a notebook.

    from minivllm.utils.progress import tqdm

On a terminal this is tqdm's ordinary text bar. In a Jupyter kernel every redraw of that bar
would arrive as one more stderr line (and tqdm.auto warns), and tqdm's widget saves only its
first state as text: a notebook run headless (the tests, the book) showed "0%" forever. Here,
in a kernel, the bar is one display output that each redraw replaces, so what the notebook
saves, and what the book shows, is the bar's last state: "100%", or where it stopped.
"""

from __future__ import annotations

import sys

from tqdm import tqdm as text_tqdm

NOTEBOOK_NCOLS = 100  # a display has no terminal width to ask for


def _in_kernel() -> bool:
    """True inside a Jupyter kernel (IPython with a kernel attached), not in a terminal IPython."""
    if "ipykernel" not in sys.modules:
        return False
    from IPython import get_ipython
    shell = get_ipython()
    return shell is not None and hasattr(shell, "kernel")


class _DisplayLine:
    """A file for tqdm that shows its latest line as one display output, updated in place."""

    def __init__(self):
        from IPython.display import display
        self.handle = None
        self._display = display

    def write(self, text: str) -> None:
        line = text.replace("\n", "\r").split("\r")
        last = next((part for part in reversed(line) if part.strip()), None)
        if last is None:  # tqdm erasing the bar (leave=False): keep its last state on show
            return
        data = {"text/plain": last.rstrip()}
        if self.handle is None:
            self.handle = self._display(data, raw=True, display_id=True)
        else:
            self.handle.update(data, raw=True)

    def flush(self) -> None:
        pass


class _KernelBar(text_tqdm):
    """tqdm's text bar drawn into one display output: the saved notebook keeps its last state."""

    def __init__(self, *args, **kwargs):
        if not kwargs.get("disable"):
            kwargs.setdefault("file", _DisplayLine())
            kwargs.setdefault("ncols", NOTEBOOK_NCOLS)
        super().__init__(*args, **kwargs)

    def close(self) -> None:
        if not self.disable:  # tqdm skips redraws within mininterval, and leave=False erases
            self.refresh()  # the bar at close: draw its true last state before either
        super().close()


def _choose() -> type[text_tqdm]:
    return _KernelBar if _in_kernel() else text_tqdm


tqdm = _choose()
