"""The `minivllm` command line.

`minivllm bench NAME [...]` runs `minivllm.bench.NAME.main(argv)`, so each chapter adds its
benchmark as one module without touching this file.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from pathlib import Path

import minivllm.bench


def bench_names() -> list[str]:
    """Benchmarks are the modules of minivllm.bench that define main(argv).

    Read as text, not imported: a helper module (code a benchmark's child runs) is no
    benchmark, and importing every one would pull in torch just to print a list.
    """
    names = []
    for info in pkgutil.iter_modules(minivllm.bench.__path__):
        path = Path(info.module_finder.path) / f"{info.name}.py"
        if not info.name.startswith("_") and path.exists() and "\ndef main(" in path.read_text():
            names.append(info.name)
    return sorted(names)


def run_bench(argv: list[str]) -> int:
    names = bench_names()
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: minivllm bench NAME [--quick] [--json FILE] ...")
        print("benchmarks: " + ", ".join(names))
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in names:
        print(f"minivllm bench: no benchmark named {name!r}; choose one of: {', '.join(names)}",
              file=sys.stderr)
        return 2
    module = importlib.import_module(f"minivllm.bench.{name}")
    return int(module.main(rest) or 0)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="minivllm", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("bench", help="run a benchmark on this machine", add_help=False)
    if argv and argv[0] == "bench":
        return run_bench(argv[1:])
    if argv and argv[0] in ("serve", "generate"):
        module = importlib.import_module(f"minivllm.entrypoints.{argv[0]}")
        return int(module.main(argv[1:]) or 0)
    parser.parse_args(argv)
    return 2


if __name__ == "__main__":
    sys.exit(main())
