"""The `minivllm` command line.

`minivllm bench NAME [...]` runs `minivllm.bench.NAME.main(argv)` for every NAME that
minivllm.bench.BENCHMARKS lists, so a chapter adds its benchmark without touching this file.
`minivllm serve [...]` runs minivllm.entrypoints.serve.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from minivllm.bench import BENCHMARKS


def bench_names() -> list[str]:
    """The benchmarks minivllm.bench.BENCHMARKS lists (nothing is imported to list them)."""
    return sorted(BENCHMARKS)


def run_bench(argv: list[str]) -> int:
    names = bench_names()
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: minivllm bench NAME [--quick] [--json FILE] ...\n\nbenchmarks:")
        for name in names:
            print(f"  {name:12s} {BENCHMARKS[name]}")
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
    sub.add_parser("serve", help="serve a model behind an OpenAI-compatible API "
                   "(`minivllm serve --help` lists its flags)", add_help=False)
    sub.add_parser("bench", help="run a benchmark on this machine "
                   "(`minivllm bench --help` lists them)", add_help=False)
    if argv and argv[0] == "bench":
        return run_bench(argv[1:])
    if argv and argv[0] == "serve":
        from minivllm.entrypoints import serve
        return int(serve.main(argv[1:]) or 0)
    parser.parse_args(argv)
    return 2


if __name__ == "__main__":
    sys.exit(main())
