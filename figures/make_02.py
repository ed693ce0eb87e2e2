"""figures/02_ipc_reference.png: `minivllm bench ipc` bandwidth and latency, measured by this
script on the machine that runs it (committed: a reference from the project's 2-core machine),
with a caption computed from that run: which transport moved the most at each size;
figures/02_copies.png: where each byte is copied, per transport.

Chapter 02 imports winners() and caption() to say the same of the reader's own run."""

import sys
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt

from minivllm.bench import ipc
from minivllm.bench.load import LoadMeter

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


def winners(record: dict) -> list[tuple[int, str, float, float]]:
    """Per message size: (size, the two-process transport that moved the most, its GB/s, that
    GB/s over memcpy's). At ipc.RATIO_SIZE the ratio is the summary table's, the median of the
    interleaved rounds, and the leader is the transport with the highest such ratio; at other
    sizes, the transport's median GB/s over memcpy's."""
    bw = {(r["transport"], r["size"]): r["gbps"] for r in record["results"]
          if r["metric"] == "bandwidth"}
    out = []
    for size in sorted({s for _, s in bw}):
        moved = {t: g for (t, s), g in bw.items() if s == size and t != "memcpy"}
        if moved and ("memcpy", size) in bw:
            vs = {t: g / bw[("memcpy", size)] for t, g in moved.items()}
            if size == ipc.RATIO_SIZE:  # the leader by the same statistic its ratio is shown in
                vs.update({t: r for t in moved
                           if (r := record.get("ratios", {}).get(f"{t}_vs_memcpy")) is not None})
            best = max(vs, key=vs.get)
            out.append((size, best, moved[best], vs[best]))
    return out


def _bw_row(record: dict, transport: str, size: int) -> dict:
    return next(r for r in record["results"] if r["metric"] == "bandwidth"
                and r["transport"] == transport and r["size"] == size)


def _ahead(record: dict, size: int, best: str, load=None) -> str:
    """Why a transport, which copies each byte at least once as memcpy does, came out ahead:
    the two sides' samples, and other programs' load only when `load` (a LoadMeter) says BUSY."""
    m, t = _bw_row(record, "memcpy", size), _bw_row(record, best, size)
    text = (f"; ahead of memcpy: memcpy's {m['runs']} samples at this size ranged "
            f"{m['gbps_min']:.2f}-{m['gbps_max']:.2f} GB/s, {best}'s {t['runs']} "
            f"{t['gbps_min']:.2f}-{t['gbps_max']:.2f}")
    text += (": the ranges overlap, the spread of the samples decides the order"
             if m["gbps_max"] >= t["gbps_min"] else
             f": every memcpy sample below every {best} run")
    if load is not None and not load.quiet():
        return text + "; the load meter says BUSY: other programs took cores during the run"
    if load is not None:
        return text + "; the load meter says quiet: this machine's own noise, not other programs"
    return text


def winner_lines(record: dict, load=None) -> list[str]:
    """One sentence per size: who moved the most between processes, against memcpy; `load`, the
    run's LoadMeter, says whether other programs' load may explain a transport ahead of memcpy."""
    lines = []
    for size, best, gbps, vs in winners(record):
        how = (f"the median of {ipc.REPEATS[record.get('quick', False)]} rounds, as in the summary"
               if size == ipc.RATIO_SIZE and f"{best}_vs_memcpy" in record.get("ratios", {})
               else "its median GB/s over memcpy's")
        lines.append(f"on this machine at {ipc.fmt_size(size)}: {best} moved the most between "
                     f"processes, {gbps:.2f} GB/s = {vs:.2f}x memcpy ({how})"
                     + (_ahead(record, size, best, load) if vs > 1 else ""))
    return lines


def caption(record: dict) -> str:
    """The figure's claim, computed: the leader at each size, and where it beat memcpy."""
    found = winners(record)
    lead = ", ".join(f"{ipc.fmt_size(s)} {best}" for s, best, _, _ in found)
    ahead = [f"{best} at {ipc.fmt_size(s)}" for s, best, _, vs in found if vs > 1]
    return (f"most GB/s between processes, this run: {lead}. Ahead of memcpy: "
            + (", ".join(ahead) if ahead else "none") + ".")


def main(quick: bool = True) -> None:
    copies_figure(HERE / "02_copies.png")
    with LoadMeter() as load:
        record = ipc.run(quick=quick, progress=False)
    text = f"{caption(record)} {load.describe(what='the order of the transports')}"
    ipc.plot(record, str(HERE / "02_ipc_reference.png"), title=load.title("reference machine"),
             caption=text)
    print(text)
    print("wrote", HERE / "02_copies.png", HERE / "02_ipc_reference.png")


if __name__ == "__main__":
    matplotlib.use("Agg")  # only when run as a script: an importer (a chapter) keeps its backend
    main(quick="--full" not in sys.argv)
