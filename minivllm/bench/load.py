"""How busy the machine was while an experiment ran, so a chapter can say when not to trust it.

    with LoadMeter() as load:
        rows = experiment()
    print(load.describe(what="the spin vs block ranking"))
    ax.set_title(load.title("spin vs block"))  # a second line "BUSY ..." when not quiet

The machine's busy CPU time comes from /proc/stat (every core, every process); subtracting the
CPU the experiment itself used leaves what other programs took. The experiment's CPU is that of
this process and of every descendant (an engine core, its workers, a server and its children),
alive or reaped inside the block, read from /proc; pass own_cpu_s only to count something else.
On Linux only; elsewhere the meter reports the load average alone (and own CPU is this process's).
"""

from __future__ import annotations

import os
import resource
import time

# Other programs may use this many cores on average before a timing comparison is suspect:
# half a core means one of our processes waited for a core about half of the time.
QUIET_OTHERS_CORES = 0.5


def _stat_fields(pid: int | str) -> list[str] | None:
    """/proc/<pid>/stat after the command name (field 3 onward), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _descendants(pid: int) -> list[int]:
    """Live descendants of `pid`, found by the parent pid of every process in /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        fields = _stat_fields(entry) if entry.isdigit() else None
        if fields:
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, stack = [], [pid]
    while stack:
        kids = children.get(stack.pop(), [])
        found += kids
        stack += kids
    return found


def _process_cpu_s(pid: int) -> float:
    """A live process's CPU seconds, its reaped children's included (/proc/<pid>/stat)."""
    fields = _stat_fields(pid)
    if fields is None:  # it exited meanwhile: its parent's reaped-children time holds it
        return 0.0
    utime, stime, cutime, cstime = (int(v) for v in fields[11:15])
    return (utime + stime + cutime + cstime) / os.sysconf("SC_CLK_TCK")


def tree_cpu_s(pid: int | None) -> float | None:
    """CPU seconds used so far by a process and its descendants (live, or reaped by a member)."""
    if pid is None:
        return None
    return sum(_process_cpu_s(p) for p in [pid, *_descendants(pid)])


def tree_rss_mib(pid: int) -> float:
    """Resident memory of a process and its descendants now, MiB (shared pages counted once
    per process, as `ps` does: an upper bound for a tree that shares memory)."""
    total = 0
    for p in [pid, *_descendants(pid)]:
        try:
            with open(f"/proc/{p}/statm") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError, ValueError):  # gone meanwhile
            pass
    return total / 2**20


def own_cpu_s() -> float:
    """CPU seconds of this process, of its reaped children and of every live descendant."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    own = time.process_time() + children.ru_utime + children.ru_stime
    if not os.path.isdir("/proc"):
        return own
    return own + sum(_process_cpu_s(pid) for pid in _descendants(os.getpid()))


def _busy_cpu_s() -> float | None:
    """CPU seconds all cores have spent busy since boot, or None without /proc/stat."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


class LoadMeter:
    """Measures the machine's CPU use over a `with` block."""

    def __enter__(self) -> "LoadMeter":
        self.load_before = os.getloadavg()[0]
        self._own0, self._busy0, self._t0 = own_cpu_s(), _busy_cpu_s(), time.monotonic()
        return self

    def __exit__(self, *exc) -> None:
        self.wall_s = time.monotonic() - self._t0
        self.own_cpu_s = own_cpu_s() - self._own0
        busy1 = _busy_cpu_s()
        self.busy_cores = None if busy1 is None else (busy1 - self._busy0) / self.wall_s
        self.load_after = os.getloadavg()[0]

    def others_cores(self, own_cpu_s: float | None = None) -> float | None:
        """Cores that other programs used on average during the block."""
        if self.busy_cores is None:
            return None
        own = self.own_cpu_s if own_cpu_s is None else own_cpu_s
        return max(0.0, self.busy_cores - own / self.wall_s)

    def quiet(self, own_cpu_s: float | None = None) -> bool:
        others = self.others_cores(own_cpu_s)
        if others is None:  # no /proc/stat: fall back on the load average before the run
            return self.load_before < QUIET_OTHERS_CORES
        return others < QUIET_OTHERS_CORES

    def describe(self, own_cpu_s: float | None = None, what: str = "these numbers") -> str:
        """One line: the load seen, and whether `what` can be trusted."""
        own_cpu_s = self.own_cpu_s if own_cpu_s is None else own_cpu_s
        cores = os.cpu_count()
        others = self.others_cores(own_cpu_s)
        seen = (f"other programs used {others:.2f} of {cores} cores on average during the run"
                if others is not None else "the CPU use of other programs is unknown here")
        text = (f"load: {seen} (this experiment: {own_cpu_s / self.wall_s:.2f} cores; "
                f"1-min load average {self.load_before:.1f} before, {self.load_after:.1f} after). ")
        if self.quiet(own_cpu_s):
            return text + "Quiet enough to read the comparison."
        return (text + f"BUSY: do not trust {what}; the processes waited for cores. Rerun when "
                f"other programs use less than {QUIET_OTHERS_CORES} core.")

    def title(self, text: str, own_cpu_s: float | None = None) -> str:
        """A plot's title: `text`, marked BUSY on a second line when the run was not quiet."""
        if self.quiet(own_cpu_s):
            return text
        others = self.others_cores(own_cpu_s)
        load = (f"other programs used {others:.1f} cores" if others is not None
                else f"load average {self.load_before:.1f}")
        return f"{text}\nBUSY ({load}): do not trust this comparison"
