"""figures/02_ipc_reference.png: `minivllm bench ipc` bandwidth and latency, measured by this
script on the machine that runs it (committed: a reference from the project's 2-core machine);
figures/02_copies.png: where each byte is copied, per transport."""

import sys
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt

from minivllm.bench import ipc

HERE = Path(__file__).resolve().parent
ROWS = [  # transport, steps of one byte's journey
    ("pipe / unix / tcp", ["sender buffer", "kernel buffer", "receiver buffer"]),
    ("shm_copy", ["sender buffer", "shared slot", "receiver buffer"]),
    ("shm (in place)", ["sender buffer", "shared slot"]),
    ("memcpy (limit)", ["buffer", "buffer"]),
]


def copies_figure(path: Path) -> None:
    fig, ax = plt.subplots(figsize=(9, 2.8))
    ax.axis("off")
    for row, (name, steps) in enumerate(ROWS):
        y = len(ROWS) - row
        ax.text(0.0, y, name, va="center", fontsize=9, weight="bold")
        for i, step in enumerate(steps):
            x = 2.4 + i * 2.3
            ax.text(x, y, step, va="center", ha="center", fontsize=8,
                    bbox=dict(boxstyle="round", fc="#f0f0f0"))
            if i:
                ax.annotate("", (x - 0.75, y), (x - 1.55, y), arrowprops=dict(arrowstyle="->"))
        ax.text(9.3, y, f"{len(steps) - 1} cop{'y' if len(steps) == 2 else 'ies'}", va="center", fontsize=9)
    ax.set(xlim=(0, 10), ylim=(0.4, len(ROWS) + 0.6))
    ax.set_title("copies of each byte (the kernel's copies also cost a system call per chunk)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(quick: bool = True) -> None:
    copies_figure(HERE / "02_copies.png")
    record = ipc.run(quick=quick, progress=False)
    ipc.plot(record, str(HERE / "02_ipc_reference.png"), title="reference machine")
    print("wrote", HERE / "02_copies.png", HERE / "02_ipc_reference.png")


if __name__ == "__main__":
    matplotlib.use("Agg")  # only when run as a script: an importer (a chapter) keeps its backend
    main(quick="--full" not in sys.argv)
