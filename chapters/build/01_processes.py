"""Writes chapters/01_processes.ipynb (no outputs). Run: .venv/bin/python chapters/build/01_processes.py"""

from pathlib import Path

from nbwriter import write_notebook
from nbformat.v4 import new_code_cell, new_markdown_cell

md, code = new_markdown_cell, new_code_cell
cells = [
md("""# 01 · Processes: why an engine splits, and how it starts its children

**vLLM 0.33.0 files this chapter points into:** `vllm/utils/system_utils.py`, `vllm/envs.py`,
`vllm/v1/executor/multiproc_executor.py`, `vllm/v1/engine/utils.py`, `vllm/v1/utils.py`,
`vllm/config/parallel.py`, `vllm/entrypoints/cli/serve.py`, and the docs page
`docs/design/arch_overview.md` ("Process Count Summary").

## 1 · Self-test
1. Two threads run a pure-Python loop on a 2-core machine. Why is that no faster than one thread?
2. Which start method is cheapest, and what two things make it unsafe?
3. Why does spawn fail on a function you defined in a notebook cell?
4. How does a worker notice that its parent was killed with `kill -9`?
5. `vllm serve -tp=2 -dp=4`: how many processes?

<details><summary>Answers</summary>

1. The GIL: one thread runs Python bytecode at a time per process. Threads take turns.
2. fork (it copies the parent, no new interpreter). It is unsafe when other threads are running
   (their locks are copied in whatever state they were in) and once CUDA is initialised (a CUDA
   context does not survive fork).
3. spawn starts a fresh interpreter that imports the target by module and name. A notebook's
   `__main__` is not importable, so the child cannot find it.
4. A death pipe: the parent holds the write end; when the parent dies the kernel closes it, and
   the child's blocking read returns EOF.
5. 4 API servers + 4 engine cores + 8 workers + 1 DP coordinator = 17.
</details>"""),
md("""## 2 · The idea
A serving engine does three kinds of work that must not wait for one another: HTTP and
tokenization (the API server), scheduling (the engine core, a busy loop), and the forward pass
(one worker per GPU). In one Python process they would share one GIL, so a slow tokenization
would stall the scheduler and the GPU would idle. vLLM V1 therefore runs them as separate
processes that talk over sockets and shared memory.

*Everyday comparison:* a restaurant. The waiter (API server) takes orders and serves plates, the
expediter (engine core) decides which dish is cooked next, the cooks (workers) cook. If one
person did all three, every table would wait while they chopped onions. Separate people need a
way to pass tickets (chapter 02), a way to hire (start methods) and a way to know when someone
has left the building (the death pipe)."""),
md("""## 3 · The picture
![processes](../figures/01_processes.png)

*Made by `figures/make_01.py`.* Each arrow from a parent to a child is a pair of pipes: the
ready pipe (child to parent, once) and the death pipe (parent to child, until the end)."""),
md("""## 4 · Experiments
### 4.1 The GIL, measured
`burn(n)` is a pure-Python loop. We run it twice: one after another, on two threads, and on two
(already started) processes; the three take turns for a few rounds, and each figure is the median.
Besides the time, we count the **cores used**: the CPU seconds the burns consumed divided by the
wall seconds they took. The work lives in `minivllm/bench/processes.py`, a module, so that a
spawned child can import it."""),
code("""import os, multiprocessing, threading, time
from minivllm.bench import processes
print(f"cores: {os.cpu_count()}")
gil = processes.gil_experiment(workers=2)
print(f"2 burns one after another: {gil['serial_s']:.3f} s   (median of {gil['rounds']} rounds)")
print(f"2 burns on 2 threads:      {gil['threads_s']:.3f} s  ({gil['threads_s'] / gil['serial_s']:.2f} x serial), "
      f"cores used {gil['threads_cores']:.2f}")
print(f"2 burns on 2 processes:    {gil['processes_s']:.3f} s  ({gil['processes_s'] / gil['serial_s']:.2f} x serial), "
      f"cores used {gil['processes_cores']:.2f}")
print(f"load average (1 min): {gil['load_1min']:.1f} runnable processes for {os.cpu_count()} cores")"""),
md("""Example output on the reference machine (2 vCPU EPYC, idle; reference, not your numbers):
threads about 1.0 × serial with 1.0 core used, processes about 0.5–0.6 × serial with 1.7–2.0
cores used. Threads never use more than one core for Python code, however idle the machine: that
is the GIL. Processes use as many cores as are free. On a busy machine (a load average at or above
your core count) there is no free core, and processes gain little. Linux may also divide the
cores between sessions before processes (`/proc/sys/kernel/sched_autogroup_enabled` = 1), so
your two processes then share the one slice of the notebook's session. On this project's shared
test machine, at a load of 4–5, we measured processes at 0.9–1.2 × serial with 0.7–1.1 cores
used. The cores used for threads stays at or below 1.0 either way."""),
md("""### 4.2 fork, spawn, forkserver: the start-up cost
`startup_cost(method)` times `minivllm.utils.mp.launch` until the child reports ready, then
shuts it down. spawn pays for a new interpreter plus imports; fork copies page tables;
forkserver forks from a clean server process that was itself spawned once."""),
code("""costs = [processes.startup_cost(m) for m in processes.METHODS]
for c in costs:
    print(f"{c['method']:>10}: ready after {c['ready_ms']:7.1f} ms (median), stopped after {c['ready_and_exit_ms']:7.1f} ms")
print(f"spawn / fork start-up: {costs[2]['ready_ms'] / costs[0]['ready_ms']:.0f} x")"""),
md("""Example output on this kind of machine (reference): fork about 3 ms, forkserver about 90 ms
(the first start also starts the server), spawn about 130 ms; with torch imported in the child,
spawn costs seconds. vLLM pays this once per worker at start-up, so it accepts spawn whenever fork
is unsafe."""),
md("""### 4.3 What breaks with fork: a thread that holds a lock
fork copies only the calling thread. A lock held by another thread is copied *held*, and
nobody in the child will ever release it. This is how a fork after logging, tokenizer or
OpenMP threads have started can deadlock."""),
code("""print(processes.fork_while_a_thread_holds_a_lock())"""),
md("""The CUDA case is the same story with a driver: a forked child that touches CUDA fails with
torch's `RuntimeError: Cannot re-initialize CUDA in forked subprocess. To use CUDA with
multiprocessing, you must use the 'spawn' start method`. That is why vLLM forces spawn once CUDA
is initialised (`_maybe_force_spawn`, below). We run on CPU, so the cell below only reports."""),
code("""from minivllm.utils import mp
print("CUDA initialised here:", mp.cuda_is_initialized())
print("threads here:", [t.name for t in threading.enumerate()])
print("minivllm would start children with:", mp.choose_start_method())"""),
md("""In Jupyter the kernel already runs threads (its IO and heartbeat threads), so minivllm picks
spawn here. From `minivllm bench ...` on a terminal, the same call picks fork."""),
md("""### 4.4 spawn and a function defined in `__main__`
This cell fails on purpose (it is tagged `raises-exception`). The parent can pickle `work` by
reference (`__main__.work`), but the spawned child is a fresh interpreter whose `__main__` is not
this notebook, so it cannot find `work`. `launch` reports the child's own traceback."""),
code("""def work(link):
    link.ready("hello")

mp.launch(work, "notebook-child", context=multiprocessing.get_context("spawn"), ready_timeout=30)""",
     metadata={"tags": ["raises-exception"]}),
md("""The fix is to put `work` in a module and import it, as `minivllm.bench.processes.ready_at_once`:"""),
code("""with mp.launch(processes.ready_at_once, "module-child", context=multiprocessing.get_context("spawn")) as h:
    print("ready message (the child's pid):", h.ready_message, "| my pid:", os.getpid())
print("shutdown ended by:", h.shutdown_how)"""),
md("""### 4.5 The `__main__` guard
spawn (and forkserver) import your script again in the child, as `__mp_main__`. Any top-level
code runs again, so a script that starts a process at top level would start one from the child
too; Python stops that with an error. We write two scripts and run them."""),
code("""import subprocess, sys, tempfile, textwrap
body = '''
import multiprocessing
from minivllm.bench.processes import burn
def main():
    p = multiprocessing.get_context("spawn").Process(target=burn, args=(10,))
    p.start(); p.join(); print("child exit code", p.exitcode)
'''
with tempfile.TemporaryDirectory() as d:
    for name, tail in [("unguarded.py", "main()\\n"), ("guarded.py", "if __name__ == '__main__':\\n    main()\\n")]:
        path = os.path.join(d, name)
        with open(path, "w") as f:
            f.write(textwrap.dedent(body) + tail)
        r = subprocess.run([sys.executable, path], capture_output=True, text=True, timeout=60)
        at = r.stderr.rfind("Error:")  # the message of the last error, which spans several lines
        error = " ".join(r.stderr[r.stderr.rfind("\\n", 0, at) + 1:].split()) if at >= 0 else "none"
        print(f"{name}: stdout {r.stdout.strip()!r}; child's error: {error[:150]!r}")"""),
md("""Example output: `unguarded.py` prints an error ending in `RuntimeError: An attempt has been made
to start a new process before the current process has finished its bootstrapping phase`, from the
child; `guarded.py` prints `child exit code 0`."""),
md("""### 4.6 How many processes `serve` starts"""),
code("""from minivllm.utils.process_count import serve_process_count
for tp, dp, api in [(1, 1, None), (4, 1, None), (2, 4, None), (2, 4, 1), (8, 2, None)]:
    c = serve_process_count(tp=tp, dp=dp, api_server_count=api)
    print(f"tp={tp} dp={dp} api={api or 'default'}: {c.describe()}")"""),
md("""The two worked examples of vLLM's docs (`docs/design/arch_overview.md`, "Process Count
Summary"): `vllm serve -tp=4` is 1 + 1 + 4 = 6 processes, and `vllm serve -tp=2 -dp=4` is
4 + 4 + 8 + 1 = 17. With TP = 1 the executor is `uni` and the worker lives inside the engine
core, so the docs' `A + DP + N` overcounts by one there; the function follows the code. Chapter 09
counts the real processes of `minivllm serve` against this function."""),
md("""## 5 · In vLLM (0.33.0)
- `vllm/envs.py:939` — `VLLM_WORKER_MULTIPROC_METHOD`, default `"fork"`, choices fork and spawn.
- `vllm/utils/system_utils.py:123` `_maybe_force_spawn`: unless the variable already says spawn,
  it overrides to spawn for a Ray actor, NUMA binding, WSL, or (line 145) `cuda_is_initialized()`.
  vLLM has no rule for Python threads; instead, before a fork, `_release_libgomp_threads`
  (line 168) parks OpenMP's threads so a forked child does not deadlock in its first parallel
  region. `get_mp_context` (line 185) applies both.
- `vllm/v1/executor/multiproc_executor.py:825-827` — the worker's ready pipe and death pipe;
  `:887` `wait_for_ready` waits on the ready pipes; `:935` `monitor_death_pipe`, a thread blocked
  in `recv()` whose `EOFError` means the parent is gone; `:1004-1013` a forked worker closes the
  parent's pipe ends it inherited; `:983` SIGTERM raises `SystemExit`; `:559`
  `_ensure_worker_termination`: wait, SIGTERM, wait 4 s, SIGKILL.
- `vllm/v1/engine/utils.py:288` — the engine core process (`EngineCoreProc.run_engine_core`);
  `:1403` `wait_for_engine_startup`, which also polls the processes' sentinels.
- `vllm/v1/utils.py:605` `shutdown(procs, timeout)` — SIGTERM, join, then kill.
- `vllm/config/parallel.py:1098-1099` — world size 1 means the `uni` executor (no worker process).
- `vllm/entrypoints/cli/serve.py:124-125` — the API server count defaults to the DP size."""),
md("""## 6 · What we add to minivllm: `minivllm/utils/mp.py`
The live source (read it, then we exercise it):"""),
code("""import inspect
print(inspect.getsource(mp))"""),
md("""Exercise it: a child that reports ready, one that fails while starting, one that is too slow,
and one that ignores the polite request."""),
code("""from minivllm.bench import processes as pr
with mp.launch(pr.ready_at_once, "ok-child") as h:
    print(h, "ready:", h.ready_message)
print("after with:", h, "exit code", h.process.exitcode)

try:
    mp.launch(pr.burn, "wrong-signature", args=(10,))  # burn(link, 10): a TypeError in the child
except mp.ChildStartError as e:
    print("ChildStartError:", str(e).splitlines()[0], "...", str(e).splitlines()[-1])

try:
    mp.launch(pr.slow_to_ready, "slow-loader", args=(30,), ready_timeout=0.5)
except mp.ReadyTimeoutError as e:
    print(type(e).__name__ + ":", e)"""),
md("""The death pipe, for real: a middle process launches a child and is then killed with
SIGKILL, so none of its cleanup code runs. The child sees EOF on its death pipe and exits by
itself within `PARENT_DEATH_GRACE_S`. (`tests/test_mp.py` does the same, under fork and spawn.)"""),
code("""import signal, psutil
middle = mp.launch(pr.middle_with_children, "middle", args=(2,), ready_timeout=60)
kids = middle.ready_message
print("middle", middle.pid, "children", kids)
os.kill(middle.pid, signal.SIGKILL)
start = time.monotonic()
while any(psutil.pid_exists(k) and psutil.Process(k).status() != psutil.STATUS_ZOMBIE for k in kids):
    time.sleep(0.05)
    if time.monotonic() - start > 15:
        raise RuntimeError("children outlived their parent")
print(f"both children gone {(time.monotonic() - start) * 1e3:.1f} ms after their parent's SIGKILL")
middle.shutdown();"""),
md("""## 7 · What can go wrong
- **fork after threads started:** a child hangs forever on its first `logging` call or in
  OpenMP. Symptom: a worker that never reports ready. Fix: spawn (minivllm switches by itself).
- **fork after CUDA:** `Cannot re-initialize CUDA in forked subprocess`. Fix: spawn.
- **spawn and `__main__`:** `AttributeError: Can't get attribute 'work' on <module '__main__'>`
  in the child. Fix: put the target in a module.
- **no `__main__` guard:** the bootstrapping `RuntimeError`, or with fork, a fork bomb.
- **no death pipe:** after `kill -9` of the server, orphaned workers keep GPU memory and ports;
  the next start fails with "address already in use" or out-of-memory.
- **no ready timeout:** a child stuck in start-up hangs the whole launch without a message.
- **SIGKILL first:** the child never unlinks its shared memory; `/dev/shm` fills up over restarts."""),
md("""## 8 · Check yourself
1. *(easy)* Which is cheaper to start, fork or spawn, and by roughly how much here? — fork; see 4.2
   (tens of times, more once the child imports torch).
2. *(easy)* What does the ready handshake add over `process.start()`? — Knowing that set-up
   (model load, sockets bound) finished, or the child's traceback if it failed, with a time limit.
3. *(medium)* Give the timeline in which a forked child deadlocks. — Thread T takes the logging
   lock; the main thread forks; the child (only a copy of the main thread) calls `logging.info`,
   waits for the lock that T's copy will never release.
4. *(medium)* Why does minivllm close other children's death-pipe write ends in a forked child?
   — Otherwise the second child holds a copy of the first child's write end; if the parent dies,
   the first child's pipe still has a writer and never reaches EOF.
5. *(hard)* Shutdown sends a request, waits, then SIGTERM, then SIGKILL. Why not SIGKILL at once,
   and why not wait forever? — SIGKILL skips `finally` blocks, so shared memory and socket files
   leak; waiting forever hangs the server on a stuck child. The steps bound the time and give each
   chance to clean up.
6. *(hard)* Which start method would you pick for an engine whose front end runs an asyncio loop
   with a thread pool, and why? — spawn (or forkserver): threads exist, so fork could copy held
   locks; the start-up cost is paid once."""),
md("""## 9 · How to explain it
"Python runs one thread of bytecode at a time per process, so vLLM splits the API server, the
engine core's busy loop and each GPU worker into processes. Children start with fork unless that
is unsafe: once CUDA is initialised vLLM switches to spawn, whose catch is that the child imports
the target, so it must live in a module. Each child reports ready over a pipe, with a timeout, and
watches a death pipe: when the parent dies, the kernel closes it, so the child reads EOF and exits.
Shutdown escalates from a request to SIGTERM to SIGKILL so cleanup runs but nothing hangs." """),
md("""## 10 · Summary
- The GIL serialises CPU-bound Python threads; processes use the cores.
- fork is fast but unsafe after threads or CUDA; spawn is safe but slow and needs importable targets.
- The `__main__` guard keeps a spawned child from re-running the launcher.
- A launch is finished when the child says ready, not when `start()` returns; a timeout names the child.
- A death pipe lets orphans exit by themselves; shutdown escalates request → SIGTERM → SIGKILL.
- `serve` starts A + DP + DP·TP·PP (+1 coordinator if DP > 1) processes, with the worker in-process at TP = 1.

## Practice
- `python judge.py 101` — launch a worker spawn-safe, with a ready handshake and a timeout.
- `python judge.py 102` — count the processes of `serve`.
"""),
]

out = Path(__file__).resolve().parents[1] / "01_processes.ipynb"
write_notebook(cells, out)
