#!/usr/bin/env python3
"""Mutation score of each exercise: mutate its reference solution, grade every mutant with the
judge, and show what the tests let through.

    python scripts/mutation_score.py                  all exercises
    python scripts/mutation_score.py 102 121 --jobs 2 --json out.json --report-dir notes/
    python scripts/mutation_score.py --json again.json --first-from out.json   the same sweep
        again, each mutant's killer from out.json graded first; prints every verdict that changed
    python scripts/mutation_score.py 431 --only listed 5e0c1a2b   the listed mutants and one more
        (a partial sweep: no score)

Every mutant is graded, the listed ones too. Per exercise: mutants made; those listed in
requirements.md that survive, as **equivalent** (no input or timing a README-following caller can
produce tells them apart) and **message text** (only the wording of an error the README leaves
open differs), counted apart; killed (by a failing test; "by timeout" when a test hung or the
mutant ran past --time-limit); survivors (every other mutant the judge passes); score = killed /
(made - equivalent - message text); each survivor's id, line and diff. A listed mutant the judge
kills, or one no longer made, is a STALE entry: the list outlived its reason. The exit status is
1 when any exercise has a survivor, a stale entry or a judge error. Each mutant is one
`judge.py NNN --file MUTANT` in its own session (fail-fast: the judge stops at the first failing
test). Ids, the two list headings and `# pragma: no mutate block` for the starter's given code:
minivllm/judge/mutants.py.

Tool: mutmut 3.8.1's operators (libcst), each mutation applied alone to the solution's text.
Measured against cosmic-ray 8.7.0 (library: mutate_code per operator occurrence) on 102/121/211:
mutants 41/43/56 vs 123/107/122 (cosmic-ray swaps every binary operator for every other), judge
s/mutant 0.26/0.84/0.76 vs 0.22/0.46/0.82 (15 each, busy machine). Over all 22 solutions mutmut
made 2613 in 43 s; cosmic-ray 3659 in 192 s (parso reparses per mutant), yet only 24 and 29 in
215/302 (mutmut 112/126). mutmut's own trampolines also pass the judge (MUTANT_UNDER_TEST reaches
the child) but cost 1.5x per mutant and wrap every function; plain mutant files need neither.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from minivllm.judge import exercise, mutants  # noqa: E402
from minivllm.utils.leaks import become_subreaper, kill_processes, shm_segments  # noqa: E402
from minivllm.utils.progress import tqdm  # noqa: E402

TERM_GRACE_S = 15.0  # the judge cleans up on SIGTERM; SIGKILL after this
_running: set[subprocess.Popen] = set()
_judge_pids: list[int] = []
_lock = threading.Lock()
_stopping = threading.Event()


def judge(ex: exercise.Exercise, path: Path, limit: float, first: str | None = None) -> dict:
    """Grade one file: {"verdict": killed | survived | timeout | error, "test", "failed",
    "seconds"}; the test named `first` runs before the others."""
    with tempfile.TemporaryDirectory(prefix=f"mutant-{ex.number}-") as tmp:
        return _judge(ex, path, limit, Path(tmp) / "grade.json", first)


def _judge(ex: exercise.Exercise, path: Path, limit: float, out: Path, first: str | None) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(  # ours first, then the caller's
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        MINIVLLM_JUDGE_PROGRESS=str(out.parent / "progress.json"))  # a mutant is not your answer
    start = time.monotonic()
    with _lock:  # no judge starts once main() is stopping them (Ctrl-C, SIGTERM)
        if _stopping.is_set():
            return {"verdict": "error", "test": "not graded: stopped", "seconds": 0.0}
        proc = subprocess.Popen([sys.executable, str(ROOT / "judge.py"), ex.number, "--file",
                                 str(path), "--json", str(out),
                                 *(["--first", first] if first else [])], cwd=ROOT, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                start_new_session=True)
        _running.add(proc)
        _judge_pids.append(proc.pid)
    try:
        _, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        stop(proc)
        return {"verdict": "timeout", "test": f"over the {limit:.0f} s time limit",
                "seconds": time.monotonic() - start}
    except BaseException:  # Ctrl-C or SIGTERM while this thread waits (the baseline grade)
        stop(proc)
        raise
    finally:
        with _lock:
            _running.discard(proc)
    seconds = time.monotonic() - start
    try:
        grade = json.loads(out.read_text())
    except (OSError, ValueError):
        return {"verdict": "error", "test": f"judge exit {proc.returncode}: "
                f"{err.decode(errors='replace')[-300:]}", "seconds": seconds}
    if grade["passed"]:
        return {"verdict": "survived", "test": "", "seconds": seconds}
    first = next(t for t in grade["tests"] if t["status"] == "fail")
    kind = first.get("kind", "fail")
    return {"verdict": "timeout" if kind == "timeout" else "killed",
            "test": f"{first['name']} ({kind})", "failed": first["name"], "seconds": seconds}


def stop(proc: subprocess.Popen, owner: bool = True) -> None:
    """SIGTERM the judge (it kills its tests and zygote), then SIGKILL what is left of it.
    Only the thread that started it (`owner`) reads its pipe; another one just waits."""
    import psutil
    try:
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.Error:
        tree = []
    proc.send_signal(signal.SIGTERM)
    wait = proc.communicate if owner else proc.wait
    try:
        wait(timeout=TERM_GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    kill_processes([p for p in tree if p.is_running()], grace=2.0, first=signal.SIGKILL)
    wait()


def grade_mutant(ex: exercise.Exercise, mutant: mutants.Mutant, limit: float,
                 first: str | None) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"mutant-{ex.number}-") as tmp:
        path = Path(tmp) / ex.file
        path.write_text(mutant.text)
        return judge(ex, path, limit, first)


def score_exercise(ex: exercise.Exercise, jobs: int, time_limit: float | None,
                   earlier: dict | None = None, only: list[str] | None = None) -> dict:
    """`earlier`: this exercise's result from an earlier sweep; each mutant's killer runs first.
    `only`: grade just these ids ("listed": the listed ones)."""
    killers = {i: r.get("failed") for i, r in (earlier or {}).get("mutants", {}).items()}
    listed = mutants.listed_mutants(ex.folder / "requirements.md")
    made = mutants.make_mutants(ex.solution.read_text(), f"solutions/{ex.solution.name}")
    ids = {m.id for m in made}
    result = {"exercise": ex.number, "title": ex.title, "made": len(made),
              "listed": {i: list(entry) for i, entry in listed.items() if i in ids},
              "not_made": sorted(set(listed) - ids), "mutants": {}}
    baseline = judge(ex, ex.solution, 600.0)
    if baseline["verdict"] != "survived":
        result["error"] = f"the reference solution does not pass: {baseline['test']}"
        return result
    limit = time_limit or 3 * baseline["seconds"] + 60
    result["time_limit_s"] = round(limit, 1)
    todo = made  # the listed ones too: a list must not outlive its reason
    if only:
        todo = [m for m in made if m.id in only or ("listed" in only and m.id in listed)]
        result["partial"] = len(todo)
    start = time.monotonic()
    pool = ThreadPoolExecutor(jobs)
    try:
        with tqdm(total=len(todo), desc=ex.number, unit="mutant", file=sys.stderr) as bar:
            for m, res in zip(todo, pool.map(
                    lambda m: grade_mutant(ex, m, limit, killers.get(m.id)), todo)):
                result["mutants"][m.id] = {**res, "line": m.line, "function": m.function,
                                           "diff": m.diff}
                bar.update()
                bar.set_postfix(survived=len(survivors(result)), stale=len(stale(result)))
    finally:  # Ctrl-C: grade no more (main() stops the judges still running)
        pool.shutdown(wait=False, cancel_futures=True)
    result["wall_s"] = round(time.monotonic() - start, 1)
    return result


def survivors(result: dict) -> list[str]:
    """Unlisted mutants the judge passes."""
    return [i for i, r in result["mutants"].items()
            if r["verdict"] == "survived" and i not in result["listed"]]


def stale(result: dict) -> list[str]:
    """Listed mutants the judge kills (or cannot grade), and listed ids no longer made."""
    return [i for i, r in result["mutants"].items()
            if i in result["listed"] and r["verdict"] != "survived"] + result["not_made"]


def held(result: dict, category: str) -> list[str]:
    """Listed mutants of `category` that survive, as their entry says."""
    return [i for i, (kind, _) in result["listed"].items() if kind == category
            and result["mutants"].get(i, {}).get("verdict") == "survived"]


def summary(result: dict) -> dict:
    verdicts = [r["verdict"] for i, r in result["mutants"].items()]
    killed = verdicts.count("killed") + verdicts.count("timeout")
    equivalent, message = len(held(result, "equivalent")), len(held(result, "message text"))
    graded = result["made"] - equivalent - message
    seconds = [r["seconds"] for r in result["mutants"].values()]
    return {"made": result["made"], "equivalent": equivalent, "message_text": message,
            "killed": killed, "timeouts": verdicts.count("timeout"),
            "survived": len(survivors(result)), "stale": len(stale(result)),
            "errors": verdicts.count("error"),
            "score": round(killed / graded, 3) if graded and "partial" not in result else None,
            "s_per_mutant": round(sum(seconds) / len(seconds), 2) if seconds else None}


def format_result(result: dict) -> str:
    if "error" in result:
        return f"{result['exercise']} {result['title']}: {result['error']}"
    s = summary(result)
    graded = s["made"] - s["equivalent"] - s["message_text"]
    score = "n/a" if s["score"] is None else f"{s['score']:.3f}"
    lines = [f"{result['exercise']} {result['title']}: {s['made']} mutants, {s['equivalent']} "
             f"equivalent, {s['message_text']} message text, {s['killed']} killed "
             f"({s['timeouts']} by timeout), {s['survived']} survived, {s['stale']} stale "
             f"entries, {s['errors']} judge errors; score {s['killed']}/{graded} = {score}; "
             f"{s['s_per_mutant']} s per mutant, {result['wall_s']} s in all "
             f"(time limit {result['time_limit_s']} s a mutant)"
             + (f"; PARTIAL: {result['partial']} graded" if "partial" in result else "")]
    for category in ("equivalent", "message text"):
        for mid in held(result, category):
            lines.append(f"  {category} {mid}: {result['listed'][mid][1]}")
    for mid in stale(result):
        r = result["mutants"].get(mid)
        if r is None:
            lines.append(f"  STALE: {mid} is listed in requirements.md but no longer made from "
                         f"the solution")
        else:
            kind, why = result["listed"][mid]
            lines += [f"\nSTALE: {mid} (line {r['line']}) is listed as {kind} ({why}), but the "
                      f"judge {r['verdict']} it: {r['test']}", r["diff"]]
    for mid, r in result["mutants"].items():
        if r["verdict"] == "timeout":
            lines.append(f"  killed by timeout {mid} (line {r['line']}): {r['test']}")
        elif r["verdict"] == "error":
            lines.append(f"  JUDGE ERROR {mid} (line {r['line']}): {r['test']}")
    for mid in survivors(result):
        r = result["mutants"][mid]
        where = f" in {r['function']}" if r["function"] else ""
        lines += [f"\nSURVIVOR {mid}  line {r['line']}{where}", r["diff"]]
    return "\n".join(lines)


def format_summary(results: list[dict]) -> str:
    rows = [f"{'ex':<4} {'made':>5} {'equiv':>5} {'message':>7} {'killed':>6} {'timeout':>7} "
            f"{'surv':>5} {'stale':>5} {'score':>6} {'s/mutant':>8} {'wall s':>7}"]
    for r in results:
        if "error" in r:
            rows.append(f"{r['exercise']:<4} {r['error']}")
            continue
        s = summary(r)
        rows.append(f"{r['exercise']:<4} {s['made']:>5} {s['equivalent']:>5} "
                    f"{s['message_text']:>7} {s['killed']:>6} {s['timeouts']:>7} "
                    f"{s['survived']:>5} {s['stale']:>5} "
                    f"{s['score'] if s['score'] is not None else 'n/a':>6} "
                    f"{s['s_per_mutant']:>8} {r['wall_s']:>7}")
    return "\n".join(rows)


def compare(earlier: dict, results: list[dict]) -> str:
    """Verdicts (killed, a timeout counted as killed, or survived) that differ from the earlier
    run's, mutants only one run made, and kills by another test than last time."""
    lines, same, moved = [], 0, 0
    for r in results:
        before = earlier.get(r["exercise"], {}).get("mutants", {})
        for mid in sorted(set(before) | set(r["mutants"])):
            a, b = before.get(mid), r["mutants"].get(mid)
            if a is None or b is None:
                lines.append(f"  {r['exercise']} {mid}: graded only in the "
                             f"{'later' if a is None else 'earlier'} run")
            elif _killed(a) != _killed(b) or "error" in (a["verdict"], b["verdict"]):
                lines.append(f"  {r['exercise']} {mid}: {a['verdict']} {a['test']} -> "
                             f"{b['verdict']} {b['test']}")
            else:
                same += 1
                moved += a.get("failed") != b.get("failed")
    head = (f"same verdict as the earlier run: {same} mutants ({moved} killed by another test); "
            f"differing: {len(lines)}")
    return "\n".join([head, *lines])


def _killed(r: dict) -> bool:
    return r["verdict"] in ("killed", "timeout")


def left_behind() -> str:
    """What the judges started here left: processes under this one, /dev/shm entries."""
    import psutil
    procs = psutil.Process().children(recursive=True)
    segments = sorted(s for s in shm_segments()
                      if any(s.startswith(f"minivllm-j{pid}") for pid in _judge_pids))
    if not procs and not segments:
        return f"nothing left behind by {len(_judge_pids)} judge runs (processes, /dev/shm)"
    return f"LEFT BEHIND: processes {[p.pid for p in procs]}, /dev/shm {segments}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("numbers", nargs="*", help="exercise numbers (default: all)")
    parser.add_argument("--jobs", type=int, default=2, help="mutants graded at once")
    parser.add_argument("--json", metavar="FILE", help="write every result as JSON")
    parser.add_argument("--time-limit", type=float, metavar="S",
                        help="seconds per mutant (default: 3x the solution's grade + 60)")
    parser.add_argument("--first-from", metavar="FILE",
                        help="an earlier run's --json: grade each mutant's killer first, and "
                             "print every verdict that differs from that run's")
    parser.add_argument("--only", nargs="+", metavar="ID",
                        help="grade only these mutant ids ('listed': every listed one); no score")
    parser.add_argument("--report-dir", metavar="DIR",
                        help="write NNN.txt per exercise as it finishes, and SUMMARY.txt")
    args = parser.parse_args(argv)
    exercises = ([exercise.find(n) for n in args.numbers] if args.numbers
                 else exercise.all_exercises())
    earlier = ({r["exercise"]: r for r in json.loads(Path(args.first_from).read_text())}
               if args.first_from else {})
    become_subreaper()  # a judge killed at the time limit leaves its orphans to us
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    results = []
    try:
        for ex in exercises:
            results.append(score_exercise(ex, args.jobs, args.time_limit,
                                          earlier.get(ex.number), args.only))
            text = format_result(results[-1])
            print(text + "\n", flush=True)
            write_reports(args, results, text)
    finally:  # also on Ctrl-C or SIGTERM: stop the judges still grading, then say what is left
        with _lock:
            _stopping.set()
            running = list(_running)
        for proc in running:
            stop(proc, owner=False)
        print(format_summary(results))
        if args.first_from:
            print(compare(earlier, results))
        print(left_behind(), flush=True)
    return 0 if all(passed(r) for r in results) else 1


def passed(result: dict) -> bool:
    """No survivor, no stale entry, no judge error, and the solution itself passes."""
    if "error" in result:
        return False
    s = summary(result)
    return not (s["survived"] or s["stale"] or s["errors"])


def write_reports(args, results: list[dict], text: str) -> None:
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    if args.report_dir:
        folder = Path(args.report_dir)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{results[-1]['exercise']}.txt").write_text(text + "\n")
        (folder / "SUMMARY.txt").write_text(format_summary(results) + "\n")


if __name__ == "__main__":
    sys.exit(main())
