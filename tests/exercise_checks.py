"""Run the judge's self-checks of many exercises in a few processes at once.

A check is mostly waiting (deadlines, trickled events, child start-up), so SHARDS processes
side by side take a fraction of the time one takes. Each shard is its own process and so its
own process tree: the judge's leak checks see only their own children.

    python tests/exercise_checks.py '[["variant", "213", "reader never sets its read flag"], ...]'

prints one JSON line per check: {"key": [...], "problem": null or the message}.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

SHARDS = 3  # on 2 cores: the judge stretches its time limits with the load it sees


def check(kind: str, number: str, name: str) -> str | None:
    from minivllm.judge import exercise, selfcheck
    ex = exercise.find(number)
    if kind == "solution":
        return selfcheck.check_solution(ex)
    if kind == "starter":
        return selfcheck.check_starter(ex)
    variant = next(v for v in ex.variants() if v.name == name)
    return selfcheck.check_variant(ex, variant)


def run_all(keys: list[tuple[str, str, str]], shards: int = SHARDS,
            seconds: dict | None = None) -> dict[tuple, str | None]:
    """{key: problem} for every key, checked in `shards` processes (keys dealt round robin);
    `seconds`, if given, gets {key: how long its check took}."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), json.dumps(keys[i::shards])],
                              stdout=subprocess.PIPE, text=True, cwd=root)
             for i in range(shards)]
    results: dict[tuple, str | None] = {}
    for proc in procs:
        out, _ = proc.communicate()
        for line in out.splitlines():
            if line.startswith("{"):
                record = json.loads(line)
                results[tuple(record["key"])] = record["problem"]
                if seconds is not None:
                    seconds[tuple(record["key"])] = record["seconds"]
    return results


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for key in json.loads(sys.argv[1]):
        start = time.monotonic()
        try:
            problem = check(*key)
        except Exception as e:  # reported on its test, not lost with the shard
            problem = f"the check itself raised {type(e).__name__}: {e}"
        print(json.dumps({"key": key, "problem": problem,
                          "seconds": round(time.monotonic() - start, 2)}), flush=True)
