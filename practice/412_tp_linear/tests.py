"""The judge's tests for exercise 412. Each receives the learner's module as `impl`.

The first test is plain tensor slicing, in this process. The others start `world_size` real
processes (forked), each joins a gloo group through the learner's init_tp, runs the learner's
layer on its shard, and sends its output back; the judge compares it with the unsplit layer
computed here. Float64, tiny sizes: a wrong split is off by whole numbers, not by rounding.
"""

from __future__ import annotations

import collections
import multiprocessing as mp
import os
import queue
import tempfile
import time
import traceback

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch._C._distributed_c10d import ProcessGroup

from minivllm.judge.api import Fail, check_equal, kill_if_alive, scaled, step, test

WAIT_S = scaled(30.0)  # a rank that has not answered in this long is stuck in a collective
IN, HIDDEN, OUT = 6, 12, 4
# A collective's kind, from the ProcessGroup method that runs it (allgather, _allgather_base,
# all_gather_single ... are all an all-gather). More specific prefixes first: "reducescatter"
# before "reduce".
KINDS = ("allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "barrier", "gather",
         "scatter", "reduce", "send", "recv")
KIND_NAMES = {"allreduce": "all_reduce", "allgather": "all_gather",
              "reducescatter": "reduce_scatter", "alltoall": "all_to_all"}
LEADING = (2, 3)  # x's leading dimensions: (batch, sequence), so x is 3-D


def tensors(seed=412):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    return {"x": r(*LEADING, IN), "w": r(HIDDEN, IN), "b": r(HIDDEN) * 10,
            "w2": r(OUT, HIDDEN), "b2": r(OUT) * 10}


def count_collectives() -> collections.Counter:
    """Count, from now on in this process, the collectives run on any process group, by what
    they do: every torch.distributed call (dist.all_gather under any name or alias,
    all_gather_into_tensor, all_gather_object ...) ends in a ProcessGroup method."""
    counts: collections.Counter = collections.Counter()
    for method in dir(ProcessGroup):
        name = method.strip("_").replace("_", "")
        kind = next((k for k in KINDS if name.startswith(k)), None)
        if kind is None or method.startswith("__"):
            continue

        def counted(self, *a, _real=getattr(ProcessGroup, method),
                    _kind=KIND_NAMES.get(kind, kind), **k):
            counts[_kind] += 1
            return _real(self, *a, **k)
        setattr(ProcessGroup, method, counted)
    return counts


def _rank_main(impl, rank, world_size, path, job, results):
    torch.set_num_threads(1)
    try:
        impl.init_tp(rank, world_size, path)
        if dist.is_initialized():
            # Every rank finishes joining before any runs the job: a rank whose job makes no
            # collective (a wrong answer) would otherwise exit while gloo still connects the
            # others, and they would fail with "Connection closed by peer" instead of the
            # wrong output that is the real cause.
            dist.barrier()
        counted = count_collectives()
        out = job(impl, rank, world_size, tensors())
        counts = dict(counted)
        results.put((rank, "ok", (out, counts)))
    except NotImplementedError as e:
        results.put((rank, "todo", str(e)))
    except BaseException as e:
        results.put((rank, "error", "".join(traceback.format_exception(e, limit=-3))))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_ranks(impl, world_size, job):
    """Run job(impl, rank, world_size, tensors) on world_size gloo ranks; [(output, counts)]."""
    torch.set_num_threads(1)
    ctx = mp.get_context("fork")
    results = ctx.Queue()
    d = tempfile.mkdtemp()
    path = os.path.join(d, "rendezvous")
    procs = [ctx.Process(target=_rank_main, args=(impl, r, world_size, path, job, results))
             for r in range(world_size)]
    for p in procs:
        p.start()
    got = {}
    try:
        deadline = time.monotonic() + WAIT_S
        while len(got) < world_size:
            try:
                rank, status, payload = results.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                missing = sorted(set(range(world_size)) - set(got))
                raise Fail(f"ranks {missing} of {world_size} did not finish within {WAIT_S:g} s: "
                           "a rank waits in a collective that another rank never calls (every "
                           "rank must make the same collective calls in the same order)") from None
            if status == "todo":
                raise NotImplementedError(payload)
            if status == "error":
                last = payload.splitlines()[-1]
                raise Fail(f"rank {rank} of {world_size} raised {last}", got=last,
                           detail=payload)
            got[rank] = payload
    finally:
        ok = len(got) == world_size
        for p in procs:
            p.join(5 if ok else 0.1)
        kill_if_alive(*procs)
        for name in os.listdir(d):
            os.unlink(os.path.join(d, name))
        os.rmdir(d)
    return [got[r] for r in range(world_size)]


def _close(got, want, what):
    got = torch.tensor(got, dtype=torch.float64) if not isinstance(got, torch.Tensor) else got
    if got.shape != want.shape:
        raise Fail(f"{what}: its shape differs from the unsplit layer's",
                   expected=tuple(want.shape), got=tuple(got.shape))
    off = (~torch.isclose(got, want, atol=1e-9)).nonzero().tolist()
    if off:  # one line: where it first differs, and how many values do
        at = tuple(off[0])
        raise Fail(f"{what} differs from the unsplit layer: {len(off)} of {want.numel()} values, "
                   f"the first at index {list(at)}", expected=want[at].item(), got=got[at].item())


# --- the tests -------------------------------------------------------------------------------
@test(input="a (12, 6) weight and a (12,) bias; world sizes 2 and 3; then world size 5")
def shards(impl):
    t = tensors()
    w, b = t["w"], t["b"]
    for ws in (2, 3):
        per_out, per_in = HIDDEN // ws, IN // ws
        for r in range(ws):
            step(f"column_shard(w (12, 6), b (12,), {r}, {ws})")
            cw, cb = impl.column_shard(w, b, r, ws)
            if cw.shape != (per_out, IN) or not torch.equal(cw, w[r * per_out:(r + 1) * per_out]):
                raise Fail(f"column_shard(w, b, {r}, {ws}): a column-parallel rank holds rows "
                           f"{r * per_out}..{(r + 1) * per_out - 1} of the (out, in) weight (its "
                           "output features)", expected=tuple(w[r * per_out:(r + 1) * per_out]
                                                              .shape), got=tuple(cw.shape))
            check_equal(cb.tolist(), b[r * per_out:(r + 1) * per_out].tolist(),
                        f"the bias slice of column_shard(w, b, {r}, {ws})")
            step(f"row_shard(w (12, 6), {r}, {ws})")
            rw = impl.row_shard(w, r, ws)
            cols = w[:, r * per_in:(r + 1) * per_in]
            if rw.shape != (HIDDEN, per_in) or not torch.equal(rw, cols):
                raise Fail(f"row_shard(w, {r}, {ws}): a row-parallel rank holds columns "
                           f"{r * per_in}..{(r + 1) * per_in - 1} of the (out, in) weight (its "
                           "input features)", expected=(HIDDEN, per_in), got=tuple(rw.shape))
        step(f"column_shard(w, None, 0, {ws})")
        check_equal(impl.column_shard(w, None, 0, ws)[1], None, "column_shard with bias None")
    for name, call in (("column_shard(w (12, 6), b, 0, 5)", lambda: impl.column_shard(w, b, 0, 5)),
                       ("row_shard(w (12, 6), 0, 5)", lambda: impl.row_shard(w, 0, 5))):
        step(name)
        try:
            got = call()
        except ValueError as e:
            if "5" not in str(e):
                raise Fail("a shard over 5 ranks raised ValueError without the sizes: say which "
                           "size does not divide by the world size", expected="... 5 ...",
                           got=str(e)) from None
            continue
        raise Fail("a shard of 12 or 6 features over 5 ranks must raise ValueError (the sizes "
                   "must divide evenly)", got=tuple(got[0].shape) if isinstance(got, tuple)
                   else tuple(got.shape))


def _all_reduce_job(impl, rank, ws, t):
    v = torch.tensor([float(rank + 1)])
    dist.all_reduce(v)
    return [dist.get_rank(), dist.get_world_size(), v.item(), dist.get_backend()]


@test(input="init_tp(rank, 3, file) in 3 processes; then an all-reduce of rank + 1", timeout=60)
def group_of_three(impl):
    got = [out for out, _ in run_ranks(impl, 3, _all_reduce_job)]
    check_equal([g[:3] for g in got], [[0, 3, 6.0], [1, 3, 6.0], [2, 3, 6.0]],
                "[rank, world size, all-reduce of rank + 1] on each rank")
    backends = [g[3] for g in got]
    if backends != ["gloo"] * 3:
        raise Fail("the process group's backend (dist.get_backend()) on each rank: the README "
                   "asks for a gloo group. Name it: init_process_group('gloo', ...); without a "
                   "backend torch picks one per device type (gloo for CPU, nccl for CUDA where "
                   "a GPU is), a different group", expected=["gloo"] * 3, got=backends)


def _labelled(what, fn, *args, **kw):
    """fn(*args, **kw); an exception comes back saying which call raised, on what input."""
    try:
        return fn(*args, **kw)
    except NotImplementedError:
        raise
    except Exception as e:
        raise RuntimeError(f"in {what}: {type(e).__name__}: {e}") from e


def cases(t):
    """(x, bias, what): a 3-D x with the bias, and a 2-D x without one."""
    return [(t["x"], t["b"], "x of shape (2, 3, 6)"), (t["x"][0], None, "x of shape (3, 6), "
                                                                        "bias None")]


def _column_job(impl, rank, ws, t):
    out = []
    for x, bias, what in cases(t):
        w, b = impl.column_shard(t["w"], bias, rank, ws)
        out += [_labelled(f"column_parallel_linear({what}, gather_output={g})",
                          impl.column_parallel_linear, x, w, b, gather_output=g).tolist()
                for g in (False, True)]
    return out


@test(input="column_parallel_linear on 2 and on 3 ranks, gather_output False and True; x of "
            "shape (2, 3, 6), then x of shape (3, 6) with bias None", timeout=60)
def column_parallel(impl):
    t = tensors()
    for ws in (2, 3):
        per = HIDDEN // ws
        for rank, (out, counts) in enumerate(run_ranks(impl, ws, _column_job)):
            check_equal(counts, {"all_gather": 2}, f"rank {rank} of {ws}: the collectives of two "
                        "calls with gather_output=True and two with False (one all_gather each "
                        "to join the slices; none without gather_output)")
            for i, (x, bias, what) in enumerate(cases(t)):
                full = F.linear(x, t["w"], bias)
                local, gathered = out[2 * i:2 * i + 2]
                _close(local, full[..., rank * per:(rank + 1) * per], f"rank {rank} of {ws}, "
                       f"{what}, gather_output=False: its slice of the output features")
                _close(gathered, full, f"rank {rank} of {ws}, {what}, gather_output=True: the "
                                       "slices all-gathered and joined along the last dimension")


def _row_job(impl, rank, ws, t):
    w = impl.row_shard(t["w"], rank, ws)
    per = IN // ws
    out = []
    for x, bias, what in cases(t):
        x_part = x[..., rank * per:(rank + 1) * per]
        out += [_labelled(f"row_parallel_linear({what}{', sliced' if p else ''}, "
                          f"input_is_parallel={p})", impl.row_parallel_linear, xx, w, bias,
                          input_is_parallel=p).tolist() for xx, p in ((x, False), (x_part, True))]
    return out


@test(input="row_parallel_linear on 2 and on 3 ranks, input_is_parallel False and True "
            "(the bias is 10x the weights' scale); x of shape (2, 3, 6), then x of shape (3, 6) "
            "with bias None", timeout=60)
def row_parallel(impl):
    t = tensors()
    for ws in (2, 3):
        for rank, (out, _) in enumerate(run_ranks(impl, ws, _row_job)):
            for i, (x, bias, what) in enumerate(cases(t)):
                full = F.linear(x, t["w"], bias)
                for got, how in zip(out[2 * i:2 * i + 2], ("input_is_parallel=False",
                                                           "input_is_parallel=True")):
                    g = torch.tensor(got, dtype=torch.float64)
                    if bias is not None and g.shape == full.shape and \
                            torch.allclose(g, full + (ws - 1) * bias):
                        raise Fail(f"rank {rank} of {ws}, {how}: the bias was added {ws} times; "
                                   "add it once, after the all-reduce (or on rank 0 only, "
                                   "before it)")
                    _close(g, full, f"rank {rank} of {ws}, {what}, {how}: the all-reduced "
                                    "output")


def _mlp_job(impl, rank, ws, t):
    return [_labelled(f"parallel_mlp({what})", impl.parallel_mlp, t["x"], t["w"], b, t["w2"], b2,
                      rank, ws).tolist()
            for what, b, b2 in (("with biases", t["b"], t["b2"]), ("biases None", None, None))]


@test(input="parallel_mlp on 2 and on 3 ranks: relu(x W1^T + b1) W2^T + b2, then with both "
            "biases None", timeout=60)
def mlp_one_all_reduce(impl):
    t = tensors()
    for ws in (2, 3):
        for rank, (out, counts) in enumerate(run_ranks(impl, ws, _mlp_job)):
            for got, b, b2, what in ((out[0], t["b"], t["b2"], ""), (out[1], None, None,
                                                                     ", biases None")):
                full = F.linear(F.relu(F.linear(t["x"], t["w"], b)), t["w2"], b2)
                _close(got, full, f"rank {rank} of {ws}: parallel_mlp{what}")
            used = counts
            if used != {"all_reduce": 2}:
                raise Fail(f"rank {rank} of {ws}: the collectives of two parallel_mlp calls. The "
                           "column layer's output slice is the row layer's input slice, so an "
                           "MLP needs one all-reduce and nothing else (the judge counts the "
                           "collectives by what they do, whatever name or alias the code calls "
                           "them by)",
                           expected={"all_reduce": 2}, got=used)
