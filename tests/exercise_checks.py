"""Run the judge's self-checks of many exercises in a few processes at once.

A check is mostly waiting (deadlines, trickled events, child start-up), so SHARDS processes
side by side take a fraction of the time one takes. Each shard is its own process and so its
own process tree: the judge's leak checks see only their own children. A shard takes the next
check when it reports the last one, so one slow check does not hold back the checks dealt
after it.

    python tests/exercise_checks.py

reads one JSON key a line on stdin (["variant", "213", "reader never sets its read flag"])
and prints one JSON line per check: {"key": [...], "problem": null or the message, "seconds": s}.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time

# On 2 cores, the 587 checks of the 22 exercises (2064 s of checks one after another) took
# 723 s in 3 shards and 514 s in 6, at 139% CPU: the judge stretches its time limits with
# the load it sees, so more shards gain little more.
SHARDS = 6
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
    """{key: problem} for every key, checked in `shards` processes that each take the next
    key when done; `seconds`, if given, gets {key: how long its check took}."""
    todo: queue.SimpleQueue = queue.SimpleQueue()
    for key in keys:
        todo.put(key)
    results: dict[tuple, str | None] = {}
    threads = [threading.Thread(target=_shard, args=(todo, results, seconds))
               for _ in range(min(shards, len(keys)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def _shard(todo: queue.SimpleQueue, results: dict, seconds: dict | None) -> None:
    """One shard process, fed a key at a time until none is left (or it dies: the keys it
    did not report are missing from `results`, and their tests say so)."""
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__)], cwd=ROOT, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        while True:
            try:
                key = todo.get_nowait()
            except queue.Empty:
                break
            proc.stdin.write(json.dumps(key) + "\n")
            proc.stdin.flush()
            record = _next_record(proc.stdout)
            if record is None:
                break
            results[tuple(record["key"])] = record["problem"]
            if seconds is not None:
                seconds[tuple(record["key"])] = record["seconds"]
    except BrokenPipeError:
        pass
    finally:
        proc.stdin.close()
        proc.stdout.close()
        proc.wait()


def _next_record(stdout) -> dict | None:
    """The shard's next report; None when it died."""
    line = stdout.readline()
    return json.loads(line) if line else None


def serve() -> None:
    """The shard's side: keys from stdin, records to stdout. Both are kept on fds of their own,
    and fds 0 and 1 become /dev/null and stderr: whatever the checks' processes read or print
    never meets the keys or the records."""
    keys, records = os.fdopen(os.dup(0)), os.fdopen(os.dup(1), "w")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    for line in keys:
        key = json.loads(line)
        start = time.monotonic()
        try:
            problem = check(*key)
        except Exception as e:  # reported on its test, not lost with the shard
            problem = f"the check itself raised {type(e).__name__}: {e}"
        print(json.dumps({"key": key, "problem": problem,
                          "seconds": round(time.monotonic() - start, 2)}), file=records, flush=True)


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    serve()
