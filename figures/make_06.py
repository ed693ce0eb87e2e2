"""Make figures/06_cuda_ipc.png: a weight hand-off by handles, on a GPU and on a CPU.

    python figures/make_06.py
"""

from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch

from drawing import box

OUT = Path(__file__).with_name("06_cuda_ipc.png")


def arrow(ax, a, b, text="", style="-|>", color="black", dy=0.03, ls="-"):
    ax.add_patch(FancyArrowPatch(a, b, arrowstyle=style, mutation_scale=12, color=color, lw=1.3,
                                 linestyle=ls))
    if text:
        ax.text((a[0] + b[0]) / 2, (a[1] + b[1]) / 2 + dy, text, ha="center", fontsize=8, color=color)


def panel(ax, title, memory, handle, open_call, wire):
    # a margin around the unit square: the boxes' rounded edges (pad 0.02) reach past 0 and 1
    ax.set_xlim(-0.04, 1.04), ax.set_ylim(-0.03, 1.0), ax.axis("off")
    ax.set_title(title, fontsize=11)
    box(ax, 0.01, 0.60, 0.24, 0.32, "trainer\nprocess\n\nweights, kept\nalive until\nthe ack", "#dbe9f6")
    box(ax, 0.75, 0.60, 0.24, 0.32, "engine\nprocess\n\nmodel weights,\nupdated\nin place", "#e2f0d9")
    box(ax, 0.22, 0.04, 0.56, 0.20, memory, "#fff2cc")
    arrow(ax, (0.26, 0.84), (0.74, 0.84), f"1. {wire}")
    arrow(ax, (0.74, 0.66), (0.26, 0.66), "3. ack: done reading", color="#7f6000")
    arrow(ax, (0.13, 0.60), (0.30, 0.25))
    arrow(ax, (0.70, 0.25), (0.87, 0.60))
    ax.text(-0.03, 0.27, handle, ha="left", fontsize=8)  # clear of the arrows above them
    ax.text(1.03, 0.27, open_call, ha="right", fontsize=8)
    ax.text(0.5, 0.44, "2. the engine maps the same bytes\nand copies them into its weights",
            ha="center", fontsize=8, style="italic")


def main() -> None:
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6))
    panel(axes[0], "CUDA: device memory, by cudaIpcMemHandle",
          "one cudaMalloc block on the GPU\n(the caching allocator's, holding many tensors)",
          "cudaIpcGetMemHandle\n(reduce_tensor)", "cudaIpcOpenMemHandle\n(rebuild_cuda_tensor)",
          "names, shapes, 64-byte handles,\nan event handle (msgpack)")
    panel(axes[1], "CPU: shared memory, by file descriptor",
          "a /dev/shm file, unlinked at once:\nonly descriptors name it",
          "share_memory_()\n(file_descriptor strategy)", "mmap of the received fd\n(rebuild_storage_fd)",
          "names, shapes, sizes (msgpack)\n+ fds as SCM_RIGHTS")
    fig.suptitle("A weight hand-off sends where the bytes are, never the bytes", fontsize=12)
    fig.tight_layout()
    fig.savefig(OUT, dpi=110)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    matplotlib.use("Agg")  # only when run as a script: an importer (a chapter) keeps its backend
    main()
