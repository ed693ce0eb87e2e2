"""What every benchmark shares: quick mode, medians, the machine record, the JSON file.

Every benchmark writes one JSON object: {"bench", "machine", "results", "ratios"}.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import time
from importlib import metadata
from typing import Any, Callable


def quick_mode() -> bool:
    """MINIVLLM_QUICK=1 shrinks every experiment (the test suite sets it)."""
    return os.environ.get("MINIVLLM_QUICK", "") not in ("", "0")


def bench_parser(name: str, doc: str) -> argparse.ArgumentParser:
    """The options every benchmark has; --help shows the first paragraph of doc (the module's)."""
    summary = " ".join(doc.split("\n\n", 1)[0].split())
    parser = argparse.ArgumentParser(prog=f"minivllm bench {name}", description=summary)
    parser.add_argument("--quick", action="store_true", help="a short run (also MINIVLLM_QUICK=1)")
    parser.add_argument("--json", metavar="FILE", help="write the results as one JSON object")
    return parser


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def machine_info() -> dict[str, Any]:
    return {
        "cores": os.cpu_count(),
        "cpu": cpu_model(),
        "python": platform.python_version(),
        "torch": _version("torch"),
        "pyzmq": _version("pyzmq"),
        "msgspec": _version("msgspec"),
        "numpy": _version("numpy"),
    }


def median_time(fn: Callable[[], Any], repeats: int) -> float:
    """Median wall time of fn() in seconds over `repeats` runs."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def spread(values: list[float]) -> float:
    """Half the range over the median: 0.1 means every value lies within +-10% of it."""
    mid = statistics.median(values)
    return (max(values) - min(values)) / 2 / mid if mid else 0.0


def page_faults() -> int:
    """Page faults this process has taken so far, minor and major (getrusage)."""
    import resource
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_minflt + usage.ru_majflt


def transparent_hugepages() -> str | None:
    """The kernel's THP mode (always, madvise or never), None where it is not Linux's."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return re.search(r"\[(\w+)\]", f.read()).group(1)
    except (OSError, AttributeError):
        return None


def huge_page_share(address: int | None = None) -> float | None:
    """The share of resident memory in transparent huge pages (/proc/self/smaps): of the whole
    process, or of the one mapping that holds `address`; None where there is no smaps."""
    rss = huge = 0
    inside = address is None
    try:
        with open("/proc/self/smaps") as f:
            for line in f:
                head = line.split(None, 1)[0]
                if "-" in head and not head.endswith(":"):  # a mapping's first line
                    start, end = (int(x, 16) for x in head.split("-"))
                    inside = address is None or start <= address < end
                elif inside and head == "Rss:":
                    rss += int(line.split()[1])
                elif inside and head == "AnonHugePages:":
                    huge += int(line.split()[1])
    except (OSError, ValueError):
        return None
    return huge / rss if rss else None


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) by nearest rank; values need not be sorted."""
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


def print_table(rows: list[dict[str, Any]], columns: list[str]) -> None:
    """Print rows as an aligned text table, formatting floats to 3 significant digits."""
    def fmt(v: Any) -> str:
        return f"{v:.3g}" if isinstance(v, float) else str(v)
    cells = [[fmt(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths)))
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)))


def write_json(path: str | None, bench: str, results: list[dict], ratios: dict[str, float],
               machine: dict[str, Any] | None = None) -> dict:
    """`machine`: what this bench adds to machine_info() (the CPU flags its figures depend on)."""
    record = {"bench": bench, "machine": {**machine_info(), **(machine or {})},
              "results": results, "ratios": ratios}
    if path:
        with open(path, "w") as f:
            json.dump(record, f, indent=2)
        print(f"wrote {path}")
    return record
