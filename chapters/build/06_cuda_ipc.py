"""Write chapters/06_cuda_ipc.ipynb (no outputs). Run: .venv/bin/python chapters/build/06_cuda_ipc.py"""

from pathlib import Path

from nbwriter import write_notebook
from nbformat.v4 import new_code_cell, new_markdown_cell

OUT = Path(__file__).resolve().parent.parent / "06_cuda_ipc.ipynb"
V = "vLLM 0.33.0, `vllm/distributed/weight_transfer/`"
cells = []


def md(text):
    cells.append(new_markdown_cell(text.strip()))


def code(text):
    cells.append(new_code_cell(text.strip()))


md(f"""
# 06 · CUDA IPC: handing weights to the engine without sending the bytes

In RLHF, a trainer updates a model and the serving engine must use the new weights for the next
batch of rollouts, often on the same GPUs. Pushing gigabytes through a socket for every update
would waste seconds. Instead the trainer sends **where the weights are**: a CUDA IPC handle, or,
on a CPU, a shared-memory file descriptor. The engine maps that memory and copies it into its own
weights in place.

This chapter builds `minivllm/distributed/weight_transfer.py` and measures the hand-off against
a pickle through a socket. vLLM pointers are to {V}, verified line by line.

Everything here runs on a laptop CPU. Cells that need a GPU say so and skip.
""")

md("""
## 1 · Self-test

1. What does `cudaIpcGetMemHandle` give you, and which memory does it name when the tensor came
   from PyTorch's caching allocator?
2. The trainer sends the handles and then frees its tensors at once. What can the engine read?
3. Why does the engine validate every shape before writing any tensor?
4. On a CPU, what crosses the socket when a tensor is "sent" as shared memory?
5. Why must a process that uses CUDA start its children with `spawn`?

<details><summary>Answers</summary>

1. A 64-byte token for the whole `cudaMalloc` block that holds the pointer. With the caching
   allocator, that block usually holds other tensors too, so torch also sends the storage's offset
   and size inside the block.
2. Anything. The freed block goes back to the caching allocator, which hands it to the next
   tensor the trainer allocates, so the engine may read another tensor's bytes. That is the
   lifetime rule: keep every exported tensor alive until the engine acknowledges.
3. So that a bad checkpoint leaves the engine serving its old, consistent weights. A half-applied
   update mixes two models, and nothing later tells you so.
4. Metadata (names, dtypes, shapes, sizes) and file descriptors, passed as `SCM_RIGHTS`
   ancillary data. The kernel installs copies of the descriptors in the receiver; the bytes stay
   where they are.
5. A forked child inherits a CUDA context it cannot use (CUDA is not fork-safe); `spawn` starts a
   fresh interpreter that initialises CUDA itself.
</details>
""")

md("""
## 2 · The idea

An engine process and a trainer process on one machine both hold the model. Copying the weights
from one to the other through a socket costs a serialization, two kernel copies, a
deserialization and a copy into place, for every byte. But the bytes are already in memory that
both processes can reach: GPU memory (any process on the machine can map another's allocation
through CUDA IPC) or a shared-memory file. So the trainer sends a small description, the engine
maps the memory and does the one copy that is really needed: into its own weights.

**An everyday comparison.** To give a colleague a 2 GB video, you do not read it aloud over the
phone: you tell them which shared drive and folder it is in. The phone call is short, the copy
happens once, and you must not delete the folder until they say "got it".

That last sentence is the whole difficulty: the handle is only as good as the memory behind it.
""")

md("""
## 3 · The picture

![weight hand-off by handles](../figures/06_cuda_ipc.png)

*Made by `figures/make_06.py`.* One round: (1) the trainer sends metadata and handles, (2) the
engine maps the same memory and copies into its own weights, (3) the engine acknowledges, and only
then may the trainer free or overwrite what it sent.
""")

md("""
## 4 · Experiments

### 4.1 The CUDA calls, and what torch wraps around them

- `cudaIpcGetMemHandle(&handle, devPtr)`: for a pointer from `cudaMalloc`, returns an opaque
  64-byte `cudaIpcMemHandle_t` naming **the whole allocation**.
- `cudaIpcOpenMemHandle(&devPtr, handle, cudaIpcMemLazyEnablePeerAccess)`: in another process on
  the same machine, maps that allocation into this process's address space and returns a pointer.
  `cudaIpcCloseMemHandle` unmaps it. The memory is freed only when its owner frees it.
- `cudaIpcGetEventHandle` / `cudaIpcOpenEventHandle`: the same for an event created with
  `cudaEventInterprocess`, so one process can wait on GPU work another has queued.

PyTorch's `torch.multiprocessing.reductions.reduce_tensor(t)` returns `(rebuild_cuda_tensor, args)`:
args hold the memory handle, the storage's size and offset inside the `cudaMalloc` block (the
caching allocator packs many tensors into one block), a *ref counter* in shared memory, and an
event handle recorded on the producer's stream. `rebuild_cuda_tensor(*args)` in the consumer opens
the handle (once per block per process: torch caches the mapping), waits on the event, and wraps
the memory as a tensor. The next cell shows the args where a GPU exists.
""")

code("""
import os, time
import torch
from torch.multiprocessing.reductions import reduce_tensor

if not torch.cuda.is_available():
    print("skipped: no CUDA GPU on this machine (torch", torch.__version__, "). On a GPU this cell prints")
    print("the fields of reduce_tensor's args: a 64-byte memory handle, the storage's offset in its")
    print("cudaMalloc block, the ref counter's shared-memory file, and the event handle.")
else:
    a = torch.ones(256, device="cuda")
    b = torch.full((256,), 2.0, device="cuda")  # small: the caching allocator puts it in a's block
    for name, t in (("a", a), ("b", b)):
        _, args = reduce_tensor(t)
        print(f"{name}: handle {len(args[7])} bytes {args[7][:8].hex()}..., storage {args[8]} bytes "
              f"at offset {args[9]} in the block, ref counter {args[11]!r} slot {args[12]}, "
              f"event sync {args[14]}")
    print("same block:", reduce_tensor(a)[1][7] == reduce_tensor(b)[1][7])
""")

md("""
### 4.2 The CPU path: shared memory named only by a descriptor

With the default `file_descriptor` sharing strategy on Linux, `share_memory_()` creates a file in
/dev/shm, **unlinks it at once**, and keeps the descriptor. No name is left to leak; the memory
lives while a descriptor or a mapping exists. (The other strategy, `file_system`, keeps names in
/dev/shm and relies on a helper daemon to remove them: we do not use it.) Sending the tensor means
sending the descriptor, as `SCM_RIGHTS` ancillary data on a Unix socket.
""")

code("""
import torch.multiprocessing as tmp

print("sharing strategy:", tmp.get_sharing_strategy())
before = set(os.listdir("/dev/shm"))
w = torch.randn(1024, 1024)
print("shared before:", w.is_shared())
w.share_memory_()  # in place: the same tensor, its storage now in shared memory
fd, nbytes = w.untyped_storage()._share_fd_cpu_()
print("shared after:", w.is_shared(), f"| {nbytes / 2**20:.0f} MiB behind fd {fd} ->", os.readlink(f"/proc/self/fd/{fd}"))
print("new names in /dev/shm:", set(os.listdir("/dev/shm")) - before or "none")
del w  # frees the storage and closes its descriptor
""")

md("""
### 4.3 A real hand-off to an engine process

`EngineProcess` (in `minivllm/distributed/weight_transfer_demo.py`, because a spawned child
cannot import a function from a notebook) starts an engine with `spawn`: it owns a Llama-shaped
stack of weights, all zeros. The trainer builds random weights and sends them by handles.
""")

code("""
from minivllm.distributed.weight_transfer_demo import EngineProcess, build_model, checksums

trainer = build_model(hidden=256, n_layers=4, seed=0)
with EngineProcess(hidden=256, n_layers=4) as engine:
    ptrs = engine.data_ptrs()
    t0 = time.perf_counter(); engine.update_ipc(trainer); t1 = time.perf_counter()
    print(f"round 1: {t1 - t0:.4f} s; engine == trainer: {engine.checksums() == checksums(trainer)}")
    with torch.no_grad():
        for p in trainer.parameters():
            p.mul_(0.5)  # a training step, in place, after the ack
    t0 = time.perf_counter(); engine.update_ipc(trainer); t1 = time.perf_counter()
    print(f"round 2: {t1 - t0:.4f} s; engine == trainer: {engine.checksums() == checksums(trainer)}")
    print("engine's tensors kept their memory (in place):", engine.data_ptrs() == ptrs)
""")

md("""
### 4.4 Measured: handles vs pickle through a socket

The same engine receives the same weights three ways (`minivllm bench weights` runs this, larger):
pickle through the pipe; a *cold* shared-memory round (the trainer's weights move into shared
memory, the engine maps them and takes a page fault per 4 KiB while it copies); and a *warm*
round (the steady state of an RL loop: the weights already live in shared memory and the engine
still has last round's mapping, so the round is one memcpy). Medians of several runs, measured
side by side.
""")

code("""
from minivllm.bench.common import print_table, quick_mode
from minivllm.bench import weights as bench_weights

sizes, repeats = ((4, 16), 3) if quick_mode() else ((16, 64, 256), 5)
rows, ratios = bench_weights.run(sizes, repeats)
print_table(rows, ["MiB", "method", "median_ms", "GB/s", "runs"])
print({k: round(v, 1) for k, v in ratios.items()})
""")

code("""
import matplotlib.pyplot as plt

methods = ["socket+pickle", "shm (cold)", "shm (warm)"]
fig, ax = plt.subplots(figsize=(7, 3.5))
xs = sorted({r["MiB"] for r in rows})
for i, m in enumerate(methods):
    ms = [next(r["median_ms"] for r in rows if r["MiB"] == x and r["method"] == m) for x in xs]
    ax.bar([j + i * 0.27 for j in range(len(xs))], ms, width=0.27, label=m)
ax.set_xticks([j + 0.27 for j in range(len(xs))], [f"{x} MiB" for x in xs])
ax.set_yscale("log"); ax.set_ylabel("median time per round (ms, log)")
ax.set_title("handing weights to an engine process, this machine"); ax.legend()
plt.show()
""")

md("""
Example output on this machine (reference: 2 vCPU AMD EPYC, 24 GiB, torch 2.13 CPU, full mode;
your numbers will differ):

```
MiB  method         median_ms  GB/s   runs
256  socket+pickle  1.25e+03   0.215  5
256  shm (warm)     18.3       14.7   5
256  shm (cold)     915        0.293  5
ipc_speedup_vs_socket: 68.4x   ipc_cold_speedup_vs_socket: 1.4x
```

Read it this way: the *first* round by shared memory is barely faster than pickle, because
moving the weights into shared memory and faulting the pages in costs about as much as a copy
through the kernel. Every later round costs one memcpy. That is why an RL loop keeps its weights
in shared (or GPU) memory and the engine keeps its mapping.
""")

md("""
### 4.5 On a GPU: the same round through CUDA IPC
""")

code("""
if not torch.cuda.is_available():
    print("skipped: no CUDA GPU here. On a GPU this cell hands a CUDA model to a CUDA engine process")
    print("through cudaIpcMemHandles and an interprocess event, and times a warm round.")
else:
    gpu_trainer = build_model(hidden=1024, n_layers=8, seed=0, device="cuda")
    with EngineProcess(hidden=1024, n_layers=8, device="cuda") as engine:
        engine.update_ipc(gpu_trainer)  # opens each handle once
        t0 = time.perf_counter(); engine.update_ipc(gpu_trainer); t1 = time.perf_counter()
        print(f"CUDA IPC round, {sum(p.numel() for p in gpu_trainer.parameters()) * 4 / 2**20:.0f} MiB: "
              f"{(t1 - t0) * 1e3:.1f} ms; equal: {engine.checksums() == checksums(gpu_trainer)}")
""")

md(f"""
## 5 · In vLLM

vLLM 0.33.0 has a weight-transfer subsystem with an IPC backend (`ipc_engine.py`) for a trainer
colocated with the engine on the same GPUs:

- `vllm/distributed/weight_transfer/ipc_engine.py:11` imports `rebuild_cuda_tensor, reduce_tensor`:
  the same torch reductions we use.
- `ipc_engine.py:409-412`: the trainer makes each weight contiguous, keeps a strong reference
  (`weight_refs`), and calls `reduce_tensor`; one handle per parameter, keyed by the GPU's UUID.
- `ipc_engine.py:325-329`: `send_weights` holds `weight_refs` across `finish_weight_update` and the
  post-send barrier, and only then `del weight_refs`: the lifetime rule. `ipc_engine.py:386` then
  calls `torch.cuda.ipc_collect()` to return blocks whose consumers let go.
- `ipc_engine.py:225-237`: the worker looks up its own GPU's UUID in the handle dict and overwrites
  the device index (`list_args[6] = device_index`) before `rebuild_cuda_tensor`: the two processes
  may number the same GPU differently (`CUDA_VISIBLE_DEVICES`).
- `ipc_engine.py:245`: the worker hands `(name, tensor)` pairs to `self.model.load_weights`, the
  model's own name mapping (stacked qkv, and so on).
- `ipc_engine.py:86-92`: pickled handles (the HTTP path) are refused unless
  `VLLM_ALLOW_INSECURE_SERIALIZATION=1`: a pickle on a socket runs code.
- `packed_tensor.py:331-332`: packed mode allocates **one** IPC buffer and exports it once;
  `packed_tensor.py:354` synchronizes the stream before yielding a chunk, so the consumer sees
  fully written bytes; `packed_tensor.py:385` (`PackedBufferImporter`) caches the consumer's
  mapping so that each export is released exactly once.
""")

md("""
## 6 · What we add to minivllm: `distributed/weight_transfer.py`

One API, two paths. The trainer calls `WeightSender(conn).send(model)`; the engine calls
`WeightReceiver(conn).receive_into(model)`, or `recv()` then `update_weights_from_ipc(model,
handles)` then `ack()`. The module docstring is the protocol:
""")

code("""
import inspect
import minivllm.distributed.weight_transfer as wt
print(wt.__doc__)
""")

code("""
print(inspect.getsource(wt.export_weights))
print(inspect.getsource(wt._export_cpu))
print(inspect.getsource(wt._export_cuda))
""")

md("""
On the engine side, validation comes first and touches nothing; only then are the handles mapped
and copied. `copy_` into the existing tensors keeps their identity and memory.
""")

code("""
print(inspect.getsource(wt.check_update))
print(inspect.getsource(wt.update_weights_from_ipc))
print(inspect.getsource(wt.WeightSender.send))
""")

md("""
Exercise it: a checkpoint with one wrong shape. The trainer gets a `WeightMismatchError` naming
the tensor and both shapes, and the engine still holds the previous round, byte for byte.
""")

code("""
good = build_model(hidden=128, n_layers=3, seed=1)
bad = build_model(hidden=128, n_layers=3, seed=2)
bad.layers[1].o_proj.weight = torch.nn.Parameter(torch.zeros(128, 96))
with EngineProcess(hidden=128, n_layers=3) as engine:
    engine.update_ipc(good)
    before = engine.checksums()
    try:
        engine.update_ipc(bad)
    except wt.WeightMismatchError as exc:
        print("rejected:", exc)
    print("engine unchanged:", engine.checksums() == before)
""")

md("""
## 7 · What can go wrong

| failure | symptom |
|---|---|
| **Lifetime**: the trainer frees an exported CUDA tensor before the ack | the engine reads whatever the caching allocator put there next: plausible numbers, wrong model. torch's IPC ref counting parks a freed block while consumers hold it, yet torch's docs still require the sender to keep the tensor alive as long as the receiver uses it; the ack is how the sender knows. |
| The trainer writes in place before the ack | a torn update: some layers from step *n*, some from *n+1* (exercise 302 makes this visible). |
| **Sync**: the engine reads before the trainer's kernels finished writing | stale or half-written weights. An interprocess CUDA event recorded after the writes, waited on by the engine's stream, orders them; the engine synchronizes before it acks. |
| **One open per process**: `cudaIpcOpenMemHandle` twice on the same handle in one process | `cudaErrorInvalidResourceHandle` or a second mapping at another address. torch caches one mapping per block per process; keep the rebuilt tensors, do not open handles yourself. |
| **Same machine only** | a handle means nothing on another host: there you need NCCL or RDMA (vLLM's `nccl_engine.py`). Between two GPUs, opening needs P2P access (`cudaIpcMemLazyEnablePeerAccess`); without it, use the same GPU or copy through the host. |
| fork after CUDA init | `RuntimeError: Cannot re-initialize CUDA in forked subprocess`: start children with `spawn`. |
| Too many open files | with the `file_descriptor` strategy each shared storage holds a descriptor: a model with thousands of separate tensors meets `ulimit -n` (we send one fd per *storage*, at most 250 per message because Linux allows 253). |
| /dev/shm too small (Docker's 64 MiB default) | `RuntimeError: unable to write to file </torch_...>`: start the container with `--shm-size`. |
| A mismatched checkpoint applied tensor by tensor | the engine serves a mix of two models. Validate everything first (exercise 301). |
""")

code("""
import resource
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
print(f"open-file limit here: soft {soft}, hard {hard}; max fds per message we send: {wt.MAX_FDS_PER_MESSAGE}")
""")

md("""
## 8 · Check yourself

- **Easy.** What crosses the socket in a CPU hand-off? *Answer: a msgpack frame of names, dtypes,
  shapes, strides, offsets and sizes, then file descriptors as SCM_RIGHTS ancillary data: a few
  hundred bytes for any model size.*
- **Easy.** Why `copy_` into the engine's tensors instead of replacing them? *Answer: other code
  (CUDA graphs, views, the optimizer of a colocated trainer) holds those tensors; replacing them
  leaves those holders on the old memory.*
- **Medium.** Give the timeline that breaks a trainer which returns from `send` without waiting
  for the ack. *Answer: T sends handles; T returns and runs an optimizer step in place; E maps and
  copies: it reads step n+1 for some tensors, or all of them, while the trainer believes it sent
  step n. On CUDA, if T freed instead, E reads another tensor's bytes.*
- **Medium.** The first shared-memory round is barely faster than pickle; later rounds are 10-70×
  faster. Why? *Answer: the first round moves the weights into shared memory and the engine takes
  a page fault per 4 KiB on its first read; later rounds reuse both the shared storage and the
  engine's mapping, leaving one memcpy.*
- **Hard.** Trainer and engine share one GPU; which channel would you choose, and why not NCCL?
  *Answer: CUDA IPC: the engine reads the trainer's memory directly, no extra copy of the data
  and no collective setup; NCCL between two processes on one GPU is not supported, and it would
  copy. Across hosts, NCCL (or RDMA) is the only option.*
- **Hard.** Why does torch refuse to let a rebuilt IPC tensor be resized? *Answer: its storage is
  a window into someone else's `cudaMalloc` block; growing it would write over neighbouring
  tensors of the producer.*
""")

md("""
## 9 · How to explain it

"The trainer doesn't send weights, it sends handles: for GPU memory a CUDA IPC handle per
tensor, for CPU memory a file descriptor of a shared-memory segment. The engine maps the same
memory and copies into its own parameters in place, after validating every name, shape and
dtype, so a bad checkpoint changes nothing. Two rules make it safe: a CUDA event orders the
engine's reads after the trainer's writes, and the trainer keeps every exported tensor alive and
unchanged until the engine acknowledges. It only works on one machine; across machines you need
NCCL."
""")

md("""
## 10 · Summary and practice

- A hand-off by handles moves metadata, not bytes: a steady-state round costs one memcpy.
- CUDA IPC handles name a whole `cudaMalloc` block; torch sends offsets and a ref counter with it.
- The lifetime rule: keep exported tensors alive and unwritten until the ack.
- Sync: an interprocess event before reading; a stream sync before acking.
- Validate all, then write all, in place.
- CPU: `share_memory_()` plus descriptors over a Unix socket, nothing left in /dev/shm.
- `minivllm bench weights` measures it on your machine (`ipc_speedup_vs_socket`).

Practice:

- `python judge.py 301`: an all-or-nothing weight update, in place, by name (a CUDA test runs
  where there is a GPU).
- `python judge.py 302`: hand weights over by shared memory, and keep them until the ack.
""")

write_notebook(cells, OUT)
