"""The judge's tests for exercise 302. Each receives the learner's module as `impl`."""

from __future__ import annotations

import json
import multiprocessing as mp
import os

import torch

from minivllm.judge.api import Fail, check_equal, scaled, test

ENGINE_WAIT_S = scaled(15.0)  # a spawned engine imports torch first; longer than this is a lost frame
SLOW_COPY_S = 0.5  # the slow engine's pause between mapping and copying


def weights(fill: float | None = None) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    out = {"embed.weight": torch.randn(8, 4, generator=gen),
           "layers.0.q_proj.weight": torch.randn(4, 4, generator=gen),
           "norm": torch.randn(4, generator=gen).double()}
    if fill is not None:
        for t in out.values():
            t.fill_(fill)
    return out


def sums(ws) -> dict[str, float]:
    return {n: t.sum().item() for n, t in ws.items()}


def is_closed(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return True
    return False


@test(input="3 tensors (float32 [8, 4] and [4, 4], float64 [4]), shared and attached in one process")
def share_then_attach(impl):
    ws = weights()
    metas, fds = impl.share(ws)
    check_equal([m["name"] for m in metas], list(ws), "the metas' names, in order")
    check_equal([m["dtype"] for m in metas], ["float32", "float32", "float64"], "the metas' dtypes")
    check_equal([list(m["shape"]) for m in metas], [[8, 4], [4, 4], [4]], "the metas' shapes")
    check_equal(len(fds), 3, "the number of fds")
    not_shared = [n for n, t in ws.items() if not t.is_shared()]
    if not_shared:
        raise Fail("share() must move the trainer's own tensors into shared memory (in place, "
                   "with share_memory_()), not copies of them", got=f"not shared: {not_shared}")
    views = impl.attach(metas, [os.dup(fd) for fd in fds])  # dups: the originals belong to ws
    for name, t in ws.items():
        if not torch.equal(views[name], t):
            raise Fail(f"attach()'s {name!r} does not hold the shared values", input=name)
    ws["norm"][0] = 123.0  # the trainer writes; a mapping of the same memory must see it
    if views["norm"][0].item() != 123.0:
        raise Fail("attach() returned a copy: a write by the trainer must show through the view, "
                   "because both map the same shared memory", expected=123.0,
                   got=views["norm"][0].item())


@test(input="attach() of 3 descriptors")
def attach_closes_the_descriptors(impl):
    ws = weights()
    metas, fds = impl.share(ws)
    dups = [os.dup(fd) for fd in fds]
    impl.attach(metas, dups)
    left = [fd for fd in dups if not is_closed(fd)]
    if left:
        raise Fail("attach() left received descriptors open: each one is a leak (map_fd closes "
                   "the descriptor it is given)", got=f"{len(left)} of 3 still open")


def with_engine(impl, delay_s: float, body) -> None:
    ctx = mp.get_context("spawn")
    conn, child_conn = ctx.Pipe()
    shapes = {n: list(t.shape) for n, t in weights().items()}
    proc = ctx.Process(target=impl.serve_engine, args=(child_conn, shapes, delay_s), daemon=True)
    proc.start()
    child_conn.close()
    try:
        body(conn)
        conn.send_bytes(b"stop")
        proc.join(ENGINE_WAIT_S)
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join()
        conn.close()


def engine_sums(conn) -> dict[str, float]:
    if not conn.poll(ENGINE_WAIT_S):
        raise Fail("the engine did not report after a round", input="one round")
    frame = conn.recv_bytes()
    if frame == b"ack":
        raise Fail("send_weights() returned before it read the engine's ack: the trainer may "
                   "free or overwrite its tensors only after the engine has copied them",
                   got="the ack was still waiting on the pipe")
    return json.loads(frame)


@test(input="two rounds to an engine process, the trainer's values changing in between",
      timeout=30, hang="A hang here usually means one side waits for a frame or descriptors "
                       "the other never sends (check the order: JSON frame, fds, ack).")
def handoff_to_another_process(impl):
    def body(conn):
        ws = weights()
        for step in range(2):
            conn.send_bytes(b"round")
            impl.send_weights(conn, ws)
            got = engine_sums(conn)
            check_equal({n: round(v, 4) for n, v in got.items()},
                        {n: round(v, 4) for n, v in sums(ws).items()},
                        f"the engine's weight sums after round {step + 1}")
            with torch.no_grad():
                for t in ws.values():
                    t.mul_(2)
    with_engine(impl, 0.0, body)


@test(input=f"a slow engine ({SLOW_COPY_S} s between mapping and copying); the trainer writes "
            "new values as soon as send_weights() returns", timeout=30)
def no_torn_update(impl):
    def body(conn):
        ws = weights(fill=1.0)
        conn.send_bytes(b"round")
        impl.send_weights(conn, ws)
        for t in ws.values():  # the next training step, in place
            t.fill_(7.0)
        got = engine_sums(conn)
        expected = sums(weights(fill=1.0))
        if got != expected:
            raise Fail("the engine copied the trainer's *next* values: the ack came before the "
                       "engine had copied (the receiver must copy first, then ack; the sender "
                       "must not return before the ack)", expected=expected, got=got)
    with_engine(impl, SLOW_COPY_S, body)
