"""minivllm.bench.BENCHMARKS is the list `minivllm bench` runs: every entry is a module with
main(argv), and every public module of minivllm.bench with a main() is an entry."""

import importlib
import re
import pkgutil

import minivllm.bench
from minivllm.bench import BENCHMARKS
from minivllm.cli import bench_names, main


def test_every_listed_benchmark_has_a_main_and_every_public_main_is_listed():
    public = {m.name for m in pkgutil.iter_modules(minivllm.bench.__path__)
              if not m.name.startswith("_")}
    with_main = {name for name in public
                 if callable(getattr(importlib.import_module(f"minivllm.bench.{name}"), "main", None))}
    assert set(BENCHMARKS) == with_main, "list the benchmark in BENCHMARKS, or make its module private"
    assert bench_names() == sorted(BENCHMARKS)


def test_an_unknown_benchmark_is_refused_with_the_list(capsys):
    assert main(["bench", "nope"]) == 2
    assert "choose one of: " in capsys.readouterr().err


def test_help_lists_every_subcommand(capsys):
    import pytest
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for command in ("serve", "bench"):
        assert f"    {command}" in out, f"`minivllm --help` does not list {command}:\n{out}"


def test_readme_lists_every_benchmark():
    from pathlib import Path
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    listed = set(re.findall(r"^\| `minivllm bench (\w+)", readme, flags=re.M))
    assert listed == set(BENCHMARKS), (
        f"README's benchmark table lists {sorted(listed)}; minivllm.bench.BENCHMARKS has "
        f"{sorted(BENCHMARKS)}")
