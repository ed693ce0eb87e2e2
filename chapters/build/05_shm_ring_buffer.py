"""Writes chapters/05_shm_ring_buffer.ipynb (no outputs). Run: .venv/bin/python chapters/build/05_shm_ring_buffer.py"""

from pathlib import Path

from nbwriter import write_notebook
from nbformat.v4 import new_code_cell, new_markdown_cell

CELLS = []


def md(text: str) -> None:
    CELLS.append(new_markdown_cell(text.strip("\n")))


def code(text: str) -> None:
    CELLS.append(new_code_cell(text.strip("\n")))


md("""
# 05 · The shared-memory ring buffer

Every step of a tensor-parallel engine starts with one broadcast: the engine core's executor
hands the same scheduler output to every worker process. vLLM does this with a ring buffer in
shared memory, `ShmRingBuffer`, wrapped in `MessageQueue`. This chapter builds both, shows why the
order of two one-byte stores decides whether it works, and measures it against ZMQ PUB/SUB.

**In vLLM 0.33.0** (all in `vllm/distributed/device_communicators/shm_broadcast.py` unless named):
`ShmRingBuffer` :277 (layout and flag states in its docstring, :293-327) ·
`memory_fence` :87 · `SpinCondition` :120 · `check_shm_free_space` :242 · `Handle` :477 ·
`MessageQueue` :495 · `wait_until_ready` :688 · `acquire_write` :729 · `acquire_read` :882 ·
`enqueue` :912 · `dequeue` :980 · `sched_yield` in `vllm/distributed/utils.py:44` ·
the executor's use in `vllm/v1/executor/multiproc_executor.py:178`, :492, :507, :720, :725.

**Builds:** `minivllm/distributed/shm_ring.py` (`ShmRingBuffer`), `spin_condition.py`
(`SpinCondition`), `shm_broadcast.py` (`MessageQueue`), and `minivllm bench ring`.
""")

md("""
## 1 · Self-test

Answer these first. If all five are easy, skim to section 6.

1. A ring has 4 chunks and 2 readers. How many bytes of flags does it hold, and where are they?
2. The writer publishes a chunk with two kinds of store: it clears the read flags and it sets the
   written flag. Which comes first, and what goes wrong the other way round?
3. Why does a reader copy the payload out *before* setting its read flag?
4. A reader polls the ring in a loop. Why is `time.sleep(0)` a bad thing to call between polls
   on CPython 3.11, and what is better?
5. A message is bigger than a chunk. What does `MessageQueue` do with it, and how does the reader
   keep the order?

<details><summary>Answers</summary>

1. 4 x (1 + 2) = 12 bytes, after all the data chunks: the metadata region starts at
   `max_chunks * max_chunk_bytes`. Chunk i's flags are one written flag, then one read flag per reader.
2. Clear the read flags first, then set the written flag. The other order passes through
   "written = 1 and my read flag = 1" with the new data in place: a reader skips it, or sets its
   read flag for the new message just before the writer clears it and so reads it twice (section 4.2).
3. Setting the read flag tells the writer it may overwrite the chunk. Flag first, copy second is a
   race in which the reader copies half of the next message.
4. `time.sleep(0)` is a `clock_nanosleep` that pays about 50 µs of timer slack, so each poll costs
   about 60 µs. `os.sched_yield()` costs about 1 µs and still lets another process run. Spin with it
   for a bounded time, then block on a socket.
5. It overflows: the chunk carries only an overflow byte, which keeps its place in the order, and
   the frames go out on a ZMQ XPUB socket. A reader that sees the byte receives the next message
   from its SUB socket.
</details>
""")

md("""
## 2 · The idea

An engine with tensor parallelism N runs N worker processes, and every step each of them needs
the same input: which requests run, their new token ids, their KV-cache block ids. Sending it N
times over N sockets costs N serializations' worth of copies and system calls. A shared-memory
ring costs one copy in, one copy out per reader, and no system call at all when everyone is busy.

**An everyday comparison.** A teacher writes each exercise on one of four whiteboards, in turn.
Under each board is a row of tick boxes, one per student. A student copies the board, *then*
ticks their box. The teacher may wipe a board only when every box under it is ticked. Before
writing a new exercise, the teacher first rubs out the old ticks, and only then turns on the
board's "ready" light. If the teacher turned the light on first, a quick student could see
"ready" with their old tick still there and skip the new exercise, or tick it in the moment before
the teacher rubs the ticks out, and copy it again on the next round.

No lock is needed because each byte has exactly one writer at each moment: the writer owns the
written flag and clearing the read flags; reader k owns setting read flag k. The order of those
stores is the whole protocol.
""")

md("""
## 3 · The picture

![ring layout](../figures/05_ring_layout.png)

Data chunks first, then `1 + n_reader` flag bytes per chunk: vLLM's layout
(`shm_broadcast.py:293-307`). Each side keeps its own current chunk index in its own memory.
The figure is made by `figures/make_05.py`.

| written | read flags | state | writer | reader k |
|---|---|---|---|---|
| 0 | any | empty | may fill it | waits |
| 1 | all 0 | fresh | waits | may read |
| 1 | some 1 | partly read | waits | may read if its flag is 0 |
| 1 | all 1 | consumed | may refill it | nothing new: waits |
""")

md("## 4 · Experiments")

code("""
import inspect
import os
import sys
import tempfile
import time
import timeit

import matplotlib.pyplot as plt
import numpy as np

from minivllm.bench.common import print_table, quick_mode

QUICK = quick_mode()  # MINIVLLM_QUICK=1 shrinks every experiment
sys.path.insert(0, os.path.abspath("../figures"))
import make_05  # noqa: E402  (the figure code, reused to redraw on your run)

print("quick mode" if QUICK else "full mode", "| cores:", os.cpu_count())
""")

md("""
### 4.1 The simplified ring: bytes and flags, nothing else

First the ring with no waiting, no serialization and no sockets: one segment, two readers, two
chunks. Each chunk holds a one-byte length and the payload. Watch the flags go through the table.
""")

code("""
from minivllm.distributed.shm_ring import ShmRingBuffer


def state(ring, idx):
    w = ring.written_offset(idx)
    written, *reads = bytes(ring.buf[w:w + ring.metadata_size])
    name = ("empty" if not written else "fresh" if not any(reads)
            else "consumed" if all(reads) else "partly read")
    return f"chunk {idx}: written={written} reads={reads} -> {name}"


def write(ring, idx, payload):
    assert ring.writable(idx), "the chunk is still being read"
    data = ring.begin_write(idx)  # written = 0
    data[0] = len(payload)
    data[1:1 + len(payload)] = payload
    data.release()
    ring.end_write(idx)  # read flags = 0, then written = 1


def read(ring, idx, reader):
    assert ring.readable(idx, reader), "nothing new for this reader"
    data = ring.chunk(idx)
    payload = bytes(data[1:1 + data[0]])  # copy out first ...
    data.release()
    ring.end_read(idx, reader)  # ... then read flag = 1
    return payload


ring = ShmRingBuffer(n_reader=2, max_chunk_bytes=32, max_chunks=2)
print("segment", ring.name, "in /dev/shm:", os.path.getsize(f"/dev/shm/{ring.name}"), "bytes;",
      "metadata starts at byte", ring.metadata_offset)
print("start:           ", state(ring, 0))
write(ring, 0, b"step 0")
print("writer wrote:    ", state(ring, 0))
print("reader 0 read", read(ring, 0, 0), state(ring, 0), "| writable:", ring.writable(0))
print("reader 1 read", read(ring, 0, 1), state(ring, 0), "| writable:", ring.writable(0))
write(ring, 0, b"step 2")
print("writer refilled: ", state(ring, 0))
ring.close()
print("after close, still in /dev/shm?", os.path.exists(f"/dev/shm/{ring.name}"))
""")

md("""
### 4.2 Why flag order matters, shown by the judge's interleaving explorer

The judge of exercise 213 runs the writer and readers as threads under a deterministic
scheduler that may switch threads at *every* load or store on the shared buffer, and it searches
the schedules with up to two preemptions (like CHESS and loom). Here it runs on 213's reference
solution, then on the known-wrong variant that sets the written flag before clearing the read
flags. The scenario is 213's: 1 reader, 2 chunks, 3 messages.
""")

code("""
from minivllm.judge import exercise

variant = next(v for v in exercise.find("213").variants() if v.name == make_05.WRONG_ORDER)
(old, new), = variant.patches
print("the wrong variant changes the writer's publish from\\n" + old + "to\\n" + new)

ok = make_05.run_scenario(make_05.reference_ring())
print(f"reference order: {ok.runs} schedules, search exhausted: {ok.exhausted}, "
      f"failure: {ok.failure and ok.failure.failure}")
bad = make_05.breaking_schedule()
print(f"wrong order: schedule number {bad.runs} breaks it -> {bad.failure.failure}\\n")
print(bad.timeline(last=40))
""")

md("""
Read the timeline (example output on this machine; the explorer is deterministic, so yours is
the same): the writer publishes chunk 0 (step 4) *before* clearing reader 0's flag. The reader
reads `m0` and sets its flag (step 9). Only then does the writer clear the flag (step 12), which
erases the reader's acknowledgement of the message it has already taken. One lap later, chunk 0
looks unread, and reader 0 receives `m0` a second time. The same drawing is
`figures/05_flag_order_schedule.png`; here it is redrawn from your run:
""")

code("""
make_05.draw_schedule(bad)
plt.show()
""")

md("""
The other half of the protocol is the reader's: copy out, then release. 213's variant "reader
sets its read flag before copying the payload out" breaks the same way, from the other side:
""")

code("""
early = make_05.run_scenario(make_05.ring_variant("reader sets its read flag before copying the payload out"))
print(f"schedule {early.runs}: {early.failure.failure}\\n")
print(early.timeline(last=14))
""")

md("""
### 4.3 Memory fences

The explorer assumes that every store is seen by the other threads in program order. Real CPUs do
not promise that in general. A **memory fence** (barrier) is an instruction that forbids the CPU
(and the compiler) to move loads and stores across it.

- **x86-64 (TSO).** Stores become visible to other cores in program order, and loads are not
  reordered with other loads. The one reordering allowed is a later load passing an earlier store
  to a different address, through the store buffer (Intel SDM, Vol. 3A, section "Memory Ordering
  in P6 and More Recent Processor Families", 8.2.2 in older editions). So "data, then flag" is
  already safe on x86 for the writer, and "flag, then data" for the reader.
- **ARMv8 (AArch64).** Weakly ordered: independent stores may become visible out of order, and so
  may loads (Arm Architecture Reference Manual for A-profile, chapter B2, "The AArch64
  Application Level Memory Model"). The writer needs a barrier
  (`DMB ISH`, or a store-release `STLR` for the flag) between the data and the flag; the reader
  needs one (`DMB ISHLD` or a load-acquire `LDAR`) between the flag and the data.

CPython runs `buf[i] = 1` as a C store inside the interpreter loop, with hundreds of instructions
between two such statements, but nothing among them is a barrier, and the GIL is per process, so
it orders nothing across processes. vLLM therefore calls `memory_fence()` (`shm_broadcast.py:87-104`),
which acquires and releases a `threading.Lock`: the lock's atomic read-modify-write instructions
carry the barrier. It fences before checking flags (:737, :849), between clearing the read flags
and setting the written flag (:790), and after publishing and after each read flag (:796, :906).
`ShmRingBuffer` in minivllm does the same. One-byte flags also matter: a single-byte store can
never be torn, so a reader sees 0 or 1, never half of a wider value. What does a fence cost here?
""")

code("""
from minivllm.distributed.shm_ring import memory_fence

n = 100_000 if QUICK else 1_000_000
flag = bytearray(1)
store_ns = timeit.timeit("flag[0] = 1", globals={"flag": flag}, number=n) / n * 1e9
fence_ns = timeit.timeit(memory_fence, number=n) / n * 1e9
print(f"example output on this machine: one-byte store {store_ns:.0f} ns, memory_fence() {fence_ns:.0f} ns")
print("a MessageQueue enqueue + dequeue pays 6 fences: well under a microsecond in total")
""")

md("""
### 4.4 Waiting: spin, sleep, or spin then block

A reader with nothing to read must wait, and how it waits decides both latency and CPU. First,
the two calls a spinning reader might put between polls:
""")

code("""
n = 2_000 if QUICK else 20_000
sleep0_us = timeit.timeit(lambda: time.sleep(0), number=n) / n * 1e6
yield_us = timeit.timeit(os.sched_yield, number=n) / n * 1e6
print(f"example output on this machine: time.sleep(0) {sleep0_us:.1f} µs, os.sched_yield() {yield_us:.2f} µs")
print("(reference, 2-vCPU EPYC: about 60 µs and 1 µs)")
""")

md("""
`time.sleep(0)` is not a yield on CPython 3.11: it is a `clock_nanosleep` that pays the timer
slack. vLLM calls `os.sched_yield()` where it can (`vllm/distributed/utils.py:41-48`).

Now three strategies for a `MessageQueue` reader, on two reader processes and a writer that sends
1 KiB messages at a fixed pace, either busy (one every 0.5 ms) or quiet (one every 20 ms):

- **spin**: poll the flag with `os.sched_yield()` forever (`busy_loop_s = inf`);
- **block**: go to sleep in `zmq.poll` on the writer's notify socket after every miss (`busy_loop_s = 0`);
- **spin then block**: spin for `busy_loop_s` after the last read, then block (minivllm and vLLM).

We use `busy_loop_s = 5 ms` so the quiet pace shows the switch; the default is 100 ms.
`cpu per s` is the CPU seconds of all three processes per second of wall time: 1.0 is one core.
""")

code("""
from minivllm.bench.ring import ReaderPool
from minivllm.bench.ring_workers import Phase

strategies = {"spin": float("inf"), "block": 0.0, "spin then block": 0.005}
paces = {0.0005: 200 if QUICK else 2000, 0.02: 15 if QUICK else 150}  # gap (s): messages
wait_rows = []
with ReaderPool(2) as pool:
    for name, busy in strategies.items():
        for gap, n_msgs in paces.items():
            r = pool.run(Phase("mq", 1024, n_msgs, pace_s=gap, busy_loop_s=busy))
            wait_rows.append({"strategy": name, "gap_ms": gap * 1e3, "p50_us": r["p50_us"],
                              "p99_us": r["p99_us"], "cpu_per_s": r["cpu_s"] / r["wall_s"]})
print("example output on this machine:")
print_table(wait_rows, ["strategy", "gap_ms", "p50_us", "p99_us", "cpu_per_s"])

fig, ax = plt.subplots(figsize=(7, 4))
for row in wait_rows:
    marker = "o" if row["gap_ms"] < 1 else "s"
    ax.scatter(row["cpu_per_s"], row["p50_us"], marker=marker, s=60)
    ax.annotate(f"{row['strategy']}, {row['gap_ms']:g} ms", (row["cpu_per_s"], row["p50_us"]),
                fontsize=8, xytext=(4, 4), textcoords="offset points")
ax.set_xlabel("CPU used, cores (all 3 processes)")
ax.set_ylabel("p50 one-way latency, µs (log)")
ax.set_yscale("log")
ax.set_title("Waiting strategies: 2 readers, 1 KiB, circles 0.5 ms gap, squares 20 ms gap")
plt.show()
""")

md("""
What to look for: spinning gives the lowest latency and burns CPU whether or not messages come;
on 2 cores it competes with the very writer it waits for. Blocking costs almost no CPU when
quiet but pays a socket wake-up and a context switch on every message (tens of µs on a quiet
machine, hundreds on a busy one). Spin-then-block takes spin's
latency while messages are frequent (the 0.5 ms gap keeps it spinning) and block's CPU when they
stop (at a 20 ms gap it is asleep most of the time). That is why vLLM's `SpinCondition`
(`shm_broadcast.py:120-236`) and ours look the way they do.
""")

md("""
### 4.5 Overflow

A chunk has a fixed size. `MessageQueue` writes a message's frames (the msgpack body and the
out-of-band array buffers from chapter 04) into one chunk behind a small header, or, if they do
not fit, writes only an overflow byte and sends the frames on a ZMQ XPUB socket. Here a writer and
a reader share one process (threads only for the ready handshake), with 4 KiB chunks:
""")

code("""
import threading

from minivllm.distributed.shm_broadcast import MessageQueue

writer = MessageQueue(1, 1, max_chunk_bytes=4096, max_chunks=4)
reader = MessageQueue.create_from_handle(writer.export_handle(), 0)
t = threading.Thread(target=reader.wait_until_ready)
t.start()
writer.wait_until_ready()
t.join()

writer.enqueue({"step": 0, "token_ids": np.arange(100, dtype=np.int32)})  # 400 B: fits
writer.enqueue({"step": 1, "token_ids": np.arange(10_000, dtype=np.int32)})  # 40 KB: overflows
for idx in range(2):
    chunk = writer.buffer.chunk(idx)
    head = bytes(chunk[:3 + 4 * 2])
    chunk.release()
    print(f"chunk {idx}: overflow byte {head[0]}, frame count {int.from_bytes(head[1:3], 'little')}")
for _ in range(2):
    msg = reader.dequeue(timeout=5)
    print("reader got step", msg["step"], "with", msg["token_ids"].shape[0], "token ids")
reader.close()
writer.close()
""")

md("""
The second chunk says only "overflow" (frame count 0 is not read). Order is kept because the
overflow byte sits in the ring where the message would have been: the reader meets it in turn,
releases the chunk and takes the next message from its SUB socket.

### 4.6 MessageQueue vs ZMQ PUB/SUB, and a sweep into overflow

`minivllm bench ring` broadcasts 1 KiB messages to 2 reader processes through both transports in
the same run: as fast as possible (messages/s, CPU seconds), and paced one per 0.5 ms (one-way
latency). The ring has 256 chunks of 64 KiB. Then it sweeps the message size past the chunk size. Both transports use the same
msgpack frames, and PUB/SUB gets the same subscription handshake and no high-water-mark drops.
""")

code("""
import json

from minivllm.bench import ring as ring_bench

out = os.path.join(tempfile.mkdtemp(), "ring.json")
ring_bench.main(["--quick", "--json", out] if QUICK else ["--repeats", "3", "--json", out])
record = json.load(open(out))
os.unlink(out)
os.rmdir(os.path.dirname(out))
""")

md("""
Reference, measured once elsewhere (2 vCPU EPYC, see `BENCHMARKS.md`; a raw ring that moves
bytes, with no serialization): shm ring with `os.sched_yield` polling 331k msgs/s, paced p50
8.3 µs; ZMQ PUB/SUB over ipc 116k msgs/s, p50 112 µs. Your ratios above are the comparison that
counts: both transports ran side by side on your machine.

Two things to read in them. The paced latency ratio is the robust one: a spinning reader sees a
message within microseconds, where PUB/SUB pays the ZMQ I/O thread and a wake-up. The messages/s
ratio depends on the machine being quiet. Three processes share two cores, and every spin is CPU
that the writer or the other reader needed; when other programs also want the cores,
`sched_yield` hands them the CPU, and the ring's lead shrinks (it can even vanish).

Where a `MessageQueue` message's time goes, 1 KiB, one process, reference numbers: `enqueue`
about 1.4 µs (msgpack encode 0.15, the flag check and three fences about 0.3, the header and
the 1 KiB copy 0.25, the rest is Python calls and the notify clock); `dequeue` about 1.5 µs per
reader (the `MsgpackDecoder.decode` call 0.45, of which msgspec itself is 0.1; the copy out
0.3; flags and fences 0.3). All three processes need 1.4 + 2 × 1.5 ≈ 4.4 µs of CPU per
message, on 2 cores: a ceiling of about 450k msgs/s before any cache line moves between cores.
PUB/SUB pays the same encode and decode but spends about 13 µs of CPU per message, most of it in
libzmq's I/O threads. The reader copies the message out of the chunk before decoding on purpose:
msgspec hands small inline arrays to the decoder as views of its input, so decoding straight
from shared memory would hand out arrays that the writer overwrites on its next lap.
""")

code("""
sweep = [r for r in record["results"] if r["part"] == "sweep"]
fig, ax = plt.subplots(figsize=(7, 4))
for transport in ("mq", "pubsub"):
    rows = [r for r in sweep if r["transport"] == transport]
    ax.plot([r["size"] for r in rows], [r["MB_per_s"] for r in rows], "o-", label=transport)
ax.axvline(ring_bench.MAX_CHUNK_BYTES, color="gray", ls="--", label="chunk size: beyond, overflow")
ax.set_xscale("log")
ax.set_yscale("log")
ax.set_xlabel("message size, bytes")
ax.set_ylabel("delivered to each reader, MB/s")
ax.set_title("2 readers: MessageQueue vs PUB/SUB over a size sweep")
ax.legend()
plt.show()
""")

md("""
Below the chunk size the ring wins because nothing crosses the kernel. Past it, `MessageQueue` is
PUB/SUB plus a chunk: the overflow path costs what the socket costs. An engine sizes its chunks so
that ordinary steps fit (vLLM's default is 24 MiB, `shm_broadcast.py:501-503`) and only rare,
huge messages overflow.

## 5 · In vLLM

- `ShmRingBuffer` (`shm_broadcast.py:277`): the layout and the four flag cases in the docstring
  (:293-314) and the note on order (:327). Creation checks /dev/shm first (:347, `check_shm_free_space` :242).
  An attaching process patches `resource_tracker.register` away (:358-366), or the tracker would
  unlink the writer's segment when the reader exits.
- `memory_fence` (:87-104): lock acquire + release as a full barrier.
- `acquire_write` (:729-798): spin with `sched_yield` until the chunk is empty or consumed, set
  written = 0 (:772), let the caller fill it, clear the read flags (:782-784), fence (:790), set
  written = 1 (:792), fence (:796).
- `acquire_read` (:882-910): wait until written = 1 and my flag = 0 (:848-852), let the caller
  read, then set my flag (:902) and fence (:906).
- `SpinCondition` (:120-236): spin while the last read is recent (`busy_loop_s`, :218), otherwise
  poll the notify SUB socket and an inproc PAIR for cancellation (:171-174, :221). The writer's PUB
  has SNDHWM = 1 (:181) and the readers' SUB CONFLATE (:159).
- `enqueue` (:912-978): pickle with out-of-band buffers, then either the chunk format
  "overflow byte, u16 count, (u32 length, bytes)..." (:960-973) or overflow: mark the chunk and
  `send_multipart` on the XPUB (:955-958). Remote readers always get the socket (:977-978).
- `dequeue` (:980-1010) and `recv` (:1013-1019): a timeout raises a bare `TimeoutError` (:757, :828, :1017).
- `wait_until_ready` (:688-719): the writer `recv`s one subscription per reader on its XPUB
  (XPUB_VERBOSE, :541), then sends `READY`.
- `MultiprocExecutor` (`vllm/v1/executor/multiproc_executor.py`): one `MessageQueue(world_size,
  local_world_size)` (:178), `enqueue((method, args, kwargs, output_rank))` (:492), one `dequeue`
  per response queue (:507); each `WorkerProc` attaches with `create_from_handle` (:720) and replies
  on its own `MessageQueue(1, 1)` (:725).

Where minivllm differs: msgpack frames instead of pickle (chapter 04), a `TimeoutError` that names
the chunk and the readers it waited for, notifications at most once per `busy_loop_s / 2` (why
that loses no wakeup is in `spin_condition.py`'s docstring), and a writer that spins 0.2 ms and
then sleeps in growing steps (up to 1 ms) instead of spinning forever on a full ring: on 2 cores
the readers need that core more than the writer does.

## 6 · What we add to minivllm

`minivllm/distributed/shm_ring.py`: the segment and the flag protocol, shown from the package's
live source.
""")

code("""
from minivllm.distributed import shm_broadcast, shm_ring, spin_condition

print(inspect.getsource(shm_ring.ShmRingBuffer))
""")

md("`spin_condition.py`: how a reader waits, and when the writer notifies.")

code("""
print(inspect.getsource(spin_condition.SpinCondition.wait))
print(inspect.getsource(spin_condition.notify_due))
""")

md("""
`message_chunk.py`: one message in one chunk (exercise 214 asks you to write this), and
`shm_broadcast.py`: `MessageQueue` writing a message into the ring, and reading it back out.
""")

code("""
from minivllm.distributed import message_chunk

print(inspect.getsource(message_chunk.pack_into))
print(inspect.getsource(message_chunk.unpack_from))
print(inspect.getsource(shm_broadcast.MessageQueue._write_local))
print(inspect.getsource(shm_broadcast.MessageQueue._read_local))
""")

md("""
Now `MessageQueue` the way the executor of chapter 08 will use it: the engine core's executor
writes each step once to a queue that N worker processes read; each worker answers on its own
queue with one reader (the executor). Worker code lives in a module, because spawn cannot pickle
a function defined in a notebook.
""")

code("""
from minivllm.bench import ring_executor_demo
from minivllm.bench.ring_executor_demo import DemoExecutor, step_round_trips

print(inspect.getsource(ring_executor_demo.worker_main))
steps = 50 if QUICK else 500
with DemoExecutor(world_size=2) as executor:
    print(executor.execute(0, np.arange(10, dtype=np.int32)))
    for n_tokens in (256, 4096, 100_000):  # the last one (400 KB) overflows the 64 KiB chunks
        t = step_round_trips(executor, steps, n_tokens)
        print(f"example output on this machine: {n_tokens:>7} token ids per step: broadcast + 2 "
              f"replies p50 {np.percentile(t, 50):7.0f} µs, p99 {np.percentile(t, 99):7.0f} µs "
              f"({steps} steps)")
""")

md("""
## 7 · What can go wrong

| what happens | symptom | what to do |
|---|---|---|
| a reader process dies | the writer's `enqueue` waits for its read flag forever | always pass a timeout; ours raises `TimeoutError` naming the reader and the chunk |
| the writer dies | readers block; its segment stays in /dev/shm until the resource tracker exits | the supervisor watches process sentinels (chapter 08) and unlinks the dead writer's segment |
| /dev/shm is small (docker's default is 64 MiB) | `SIGBUS` on the first write past the free space, far from the cause | check free space before creating (ours and vLLM's), start docker with `--shm-size` or `--ipc=host` |
| readers connect late (slow joiner) | the first messages on the overflow socket are lost | `wait_until_ready()` counts subscriptions through XPUB before anything is sent |
| readers spin on a 2-core machine | everything is slower, the writer starves | spin for a bounded time with `sched_yield`, then block; never `time.sleep(0)` |
| chunks too small | every step overflows: PUB/SUB speed, plus a chunk | size chunks so that ordinary steps fit |
| `close()` forgotten | segments and ipc socket files pile up | context manager or `close()`, with `weakref.finalize` as the fallback |
| one queue used from two threads | torn messages, wrong current index | one reader per queue per process; `shutdown()` is the only call from another thread |

Two of them live. A worker killed mid-stream, and a ring that does not fit:
""")

code("""
before = set(os.listdir("/dev/shm"))
with DemoExecutor(world_size=2) as executor:
    executor.execute(0, np.arange(8, dtype=np.int32))
    executor.procs[1].kill()
    executor.procs[1].join()
    try:
        for step in range(1, 20):
            executor.execute(step, np.arange(8, dtype=np.int32), timeout=1.0)
    except TimeoutError as e:
        print("TimeoutError:", e)
print("segments left behind:", set(os.listdir("/dev/shm")) - before or "none")

from minivllm.distributed.shm_ring import check_shm_free_space

try:
    check_shm_free_space(1 << 50)
except RuntimeError as e:
    print("RuntimeError:", e)
""")

md("""
## 8 · Check yourself

**Easy.** A `ShmRingBuffer(n_reader=3, max_chunk_bytes=1024, max_chunks=8)`: at which byte offset
is reader 2's flag of chunk 5?
<details><summary>Answer</summary>
The metadata starts at 8 x 1024 = 8192; chunk 5's metadata at 8192 + 5 x (1 + 3) = 8212; the
written flag is byte 0 of it, reader 2 is byte 3: offset 8215.
</details>

**Easy.** Why is no lock needed between the writer and the readers?
<details><summary>Answer</summary>
Each flag byte has one writer at a time (the writer owns the written flag and clearing the read
flags; reader k owns setting its own read flag), the stores are single bytes (never torn), and the
order of the stores, with fences, carries the hand-off.
</details>

**Medium.** Give the timeline that breaks a reader that sets its read flag before copying the payload out.
<details><summary>Answer</summary>
1 reader, 2 chunks. The writer fills chunk 0 with m0 and m1 into chunk 1. The reader sees chunk 0
written, sets its read flag (the chunk is now "consumed"), and is preempted. The writer laps the
ring: chunk 0 is writable, so it writes m2's bytes over m0's. The reader resumes and copies m2
(or half of m0 and half of m2) as message 0. Section 4.2 printed such a schedule.
</details>

**Medium.** The engine sends a 30 MB tensor once every few minutes (say a grammar bitmask), and
small steps otherwise. Would you grow the chunks to 32 MiB, or let the big one overflow? Why?
<details><summary>Answer</summary>
Let it overflow, unless it is frequent. The ring costs max_chunks x max_chunk_bytes of /dev/shm per
queue, and 10 chunks of 32 MiB is 320 MiB, which breaks docker's 64 MiB default. The rare message
pays PUB/SUB speed once. If such messages come every step, size the chunks for them (that is
vLLM's 24 MiB default).
</details>

**Medium.** One worker of four is slow to read. What happens to the other three and to the writer?
<details><summary>Answer</summary>
The writer can run at most max_chunks messages ahead of the slowest reader; then it waits for that
reader's flag. The fast readers drain what is there and wait too. A broadcast ring runs at the
speed of its slowest reader; in an engine that is fine, since a step needs every worker anyway.
</details>

**Hard.** The writer notifies readers at most once per busy_loop_s / 2. Why can a blocked reader
not miss a message, and what is the worst case if the writer process is descheduled in the
middle of `enqueue`?
<details><summary>Answer</summary>
A reader blocks only busy_loop_s after its last read, and it re-checks the ring after deciding to
block. A write without a notification came less than busy_loop_s / 2 after a notified one, which
this reader read, so at that moment it was still spinning and sees the write. If the writer is
preempted for more than busy_loop_s / 2 between publishing and taking the time, the reasoning
fails; the reader's poll wakes after RECHECK_S (1 s) anyway, so the cost is one late message, not a
hang.
</details>

**Hard.** The executor runs on ARM. Which two places in the ring need a barrier, and what does each prevent?
<details><summary>Answer</summary>
The writer between the data (and cleared read flags) and setting written = 1: without it a reader
may see the flag before the data. The reader between seeing written = 1 and loading the data (a
load-load barrier, or acquire on the flag load): without it the reader may load stale data that was
speculated before the flag. Also the reader's copy-out must complete before its read flag is
visible, or the writer may overwrite data still being read.
</details>

## 9 · How to explain it

"Every step, the engine core has to hand the same input to every tensor-parallel worker. vLLM puts
a ring of fixed-size chunks in shared memory, with one written flag and one read flag per reader
for each chunk. The writer waits until a chunk is empty or read by everyone, writes the data,
clears the read flags and only then sets the written flag; each reader copies the data out and
only then sets its own read flag. No locks, just that order, plus memory fences for weakly ordered
CPUs. Readers spin with sched_yield while steps are frequent and block on a ZMQ socket when idle.
Messages too big for a chunk overflow to ZMQ, with a marker in the ring to keep the order. It
beats PUB/SUB because in the steady state nothing crosses the kernel."

## 10 · Summary

- The ring is data chunks then flags, one written flag and one read flag per reader per chunk.
- Writer: wait for empty or consumed, write, clear read flags, fence, set written. Reader: wait
  for written and not yet read, copy out, fence, set read.
- The wrong order passes through "written and already read": the interleaving explorer finds the
  schedule that delivers a message twice in a few hundred runs.
- x86 keeps store order, ARM does not: fence anyway, with a lock acquire and release from Python.
- Wait by spinning with `os.sched_yield()` for a bounded time, then block on a notify socket;
  never `time.sleep(0)`.
- Too big for a chunk: overflow to ZMQ XPUB, marked in the ring. Readers on other nodes use tcp PUB/SUB.
- `MessageQueue` is the executor's broadcast: one queue to N workers, one reply queue per worker.

## Practice

- **213 · shared-memory broadcast ring buffer**: the layout, the writer and the readers, graded
  with the interleaving explorer. `python judge.py 213` (hint: `python judge.py 213 --hint`).
- **214 · packing a message into a chunk, with overflow**: the chunk format of `MessageQueue`,
  including the exact fit, multi-byte frames, and the copy out. `python judge.py 214`.
""")


def main() -> None:
    out = Path(__file__).resolve().parents[1] / "05_shm_ring_buffer.ipynb"
    write_notebook(CELLS, out)


if __name__ == "__main__":
    main()
