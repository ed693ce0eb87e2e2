"""The judge's tests for exercise 302. Each receives the learner's module as `impl`."""

from __future__ import annotations

import json
import mmap
import multiprocessing as mp
import os
import socket
import threading
import traceback

import torch

from minivllm.judge.api import Fail, check_equal, scaled, step, test

ENGINE_WAIT_S = scaled(15.0)  # a hang guard: an engine's frame not here after this is lost
SLOW_COPY_S = 0.5  # the slow engine's pause between mapping and copying
KEEP: list = []  # tensors kept alive until the test process exits


def weights(fill: float | None = None) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    out = {"embed.weight": torch.randn(8, 4, generator=gen),
           "layers.0.q_proj.weight": torch.randn(4, 4, generator=gen),
           "norm": torch.randn(4, generator=gen).double()}
    if fill is not None:
        for t in out.values():
            t.fill_(fill)
    return out


def kept_weights() -> dict[str, torch.Tensor]:
    """weights(), freed only when the test process exits: a storage whose descriptor the
    learner's code closed aborts the process when it is freed (see engine_copies_in_place)."""
    ws = weights()
    KEEP.append(ws)
    return ws


def sums(ws) -> dict[str, float]:
    return {n: t.sum().item() for n, t in ws.items()}


def is_closed(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return True
    return False


def _identity(fd: int) -> tuple[int, int] | None:
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _file_of_memory(t: torch.Tensor) -> tuple[int, int] | None:
    """(device, inode) of the file mapped at a shared tensor's memory, from /proc/self/maps."""
    ptr = t.data_ptr()
    with open("/proc/self/maps") as maps:
        for line in maps:
            span, _, _, dev, inode = line.split(None, 5)[:5]
            lo, hi = (int(x, 16) for x in span.split("-"))
            if lo <= ptr < hi:
                major, minor = (int(x, 16) for x in dev.split(":"))
                return os.makedev(major, minor), int(inode)
    return None


class _MapWatch:
    """While active, impl.map_fd keeps every storage it makes alive until the test process exits
    and notes the descriptor that storage keeps (map_fd maps a duplicate of the one it is given,
    often under a number just freed), and os.close notes who closes one of those. Leaving fails
    the test if a storage lost its descriptor: the learner closed a descriptor twice. (Freed,
    such a storage aborts the process natively, exit -6, before any verdict could name it.)"""

    def __init__(self, impl, who: str):
        self.impl, self.who = impl, who
        self.kept: list[tuple[int, tuple[int, int] | None]] = []  # (descriptor, its file)
        self.closers: list[str] = []

    def __enter__(self) -> "_MapWatch":
        self.real_map, self.real_close = self.impl.map_fd, os.close
        self.impl.map_fd, os.close = self._map, self._close
        return self

    def _map(self, fd: int, nbytes: int):
        storage = self.real_map(fd, nbytes)
        KEEP.append(storage)
        own, _ = storage._share_fd_cpu_()  # the storage's own descriptor
        self.kept.append((own, _identity(own)))
        return storage

    def _close(self, fd: int) -> None:
        if any(fd == own for own, _ in self.kept):
            caller = traceback.extract_stack(limit=2)[0]
            self.closers.append(f"{os.path.basename(caller.filename)} line {caller.lineno}: "
                                f"{caller.line}")
        self.real_close(fd)

    def __exit__(self, *exc) -> None:
        self.impl.map_fd, os.close = self.real_map, self.real_close
        lost = [own for own, ident in self.kept if _identity(own) != ident]
        if lost:
            line = f", at {self.closers[0]}" if self.closers else ""
            raise Fail(f"{self.who} closed descriptors twice{line}: map_fd had already closed "
                       "each descriptor it was given, and the storage it returns keeps a "
                       "duplicate, often under a number just freed, so closing the received "
                       "numbers again closed the storages' own descriptors (freeing such a "
                       "storage aborts the process). Remove that os.close: map_fd closes the "
                       "descriptor", expected="every mapped storage keeps its descriptor",
                       got=f"{len(lost)} of {len(self.kept)} lost theirs")


@test(input="3 tensors (float32 [8, 4] and [4, 4], float64 [4]), shared and attached in one process")
def share_then_attach(impl):
    ws = weights()
    step("share(3 tensors: float32 [8, 4] and [4, 4], float64 [4])")
    metas, fds = impl.share(ws)
    check_equal([m["name"] for m in metas], list(ws), "the metas' names, in order")
    check_equal([m["dtype"] for m in metas], ["float32", "float32", "float64"], "the metas' dtypes")
    check_equal([list(m["shape"]) for m in metas], [[8, 4], [4, 4], [4]], "the metas' shapes")
    check_equal([m["nbytes"] for m in metas], [128, 64, 32], "the metas' nbytes (each storage's "
                "size in bytes, untyped_storage().nbytes(): map_fd maps that many, not the "
                "element count)")
    check_equal(len(fds), 3, "the number of fds")
    not_shared = [n for n, t in ws.items() if not t.is_shared()]
    if not_shared:
        raise Fail("share() must move the trainer's own tensors into shared memory (in place, "
                   "with share_memory_()), not copies of them", got=f"not shared: {not_shared}")
    step("attach(those metas, duplicates of those descriptors)")
    with _MapWatch(impl, "attach()"):
        views = impl.attach(metas, [os.dup(fd) for fd in fds])  # dups: the originals belong to ws
    for name, t in ws.items():
        if not torch.equal(views[name], t):
            raise Fail(f"attach()'s {name!r} does not hold the shared values", input=name)
    ws["norm"][0] = 123.0  # the trainer writes; a mapping of the same memory must see it
    if views["norm"][0].item() != 123.0:
        raise Fail("attach() returned a copy: a write by the trainer must show through the view, "
                   "because both map the same shared memory", expected=123.0,
                   got=views["norm"][0].item())
    more = {"experts.w": torch.arange(24.0).reshape(2, 3, 4).to(torch.bfloat16),
            "positions": torch.arange(3, dtype=torch.int64) * (1 << 40)}
    step("share({'experts.w': bfloat16 [2, 3, 4], 'positions': int64 [3]})")
    metas, fds = impl.share(more)
    check_equal([(m["dtype"], list(m["shape"])) for m in metas],
                [("bfloat16", [2, 3, 4]), ("int64", [3])], "the metas of a 3-D bfloat16 and an "
                "int64 tensor")
    step("attach(the metas and descriptors of a bfloat16 [2, 3, 4] and an int64 [3])")
    try:
        with _MapWatch(impl, "attach()"):
            views = impl.attach(metas, [os.dup(fd) for fd in fds])
    except (KeyError, TypeError, AttributeError) as e:
        raise Fail(f"attach() cannot rebuild a bfloat16 or int64 tensor ({type(e).__name__}: "
                   f"{e}): take the dtype by its name from torch (getattr(torch, name)), "
                   "not from a table of a few", input="bfloat16 [2, 3, 4], int64 [3]") from None
    for name, t in more.items():
        if not torch.equal(views[name], t) or views[name].dtype != t.dtype:
            raise Fail(f"attach()'s {name!r} does not hold the shared tensor",
                       expected=f"{t.dtype} {list(t.shape)}",
                       got=f"{views[name].dtype} {list(views[name].shape)}", input=name)


@test(input="attach() of 3 descriptors; again, with each number that map_fd frees reused at "
            "once by a new pipe (what another thread's open() may get)")
def attach_closes_the_descriptors(impl):
    ws = weights()
    step("share(3 tensors)")
    metas, fds = impl.share(ws)
    dups = [os.dup(fd) for fd in fds]
    step("attach(3 metas, 3 descriptors)")
    impl.attach(metas, dups)
    left = [fd for fd in dups if not is_closed(fd)]
    if left:
        raise Fail("attach() left received descriptors open: each one is a leak (map_fd closes "
                   "the descriptor it is given)", got=f"{len(left)} of 3 still open")
    real, reused = impl.map_fd, []

    def map_then_reuse(fd, nbytes):
        storage = real(fd, nbytes)
        r, w = os.pipe()
        if r != fd:  # the number map_fd freed now names the judge's pipe
            os.dup2(r, fd)
            os.close(r)
        reused.append((fd, w))
        return storage
    impl.map_fd = map_then_reuse
    step("attach(3 metas, 3 descriptors), each number map_fd frees reused at once by a new pipe")
    try:
        impl.attach(metas, [os.dup(fd) for fd in fds])
    finally:
        impl.map_fd = real
        closed = [fd for fd, _ in reused if is_closed(fd)]
        for fd, w in reused:
            os.close(w)
            if fd not in closed:
                os.close(fd)
    if closed:
        raise Fail("attach() closed descriptors that map_fd had already closed: the process "
                   "reused those numbers for a new pipe, which attach() then closed. map_fd "
                   "closes its descriptor: never close it again", got=f"the judge's fds {closed} "
                   "closed", input="each number map_fd frees reused at once")


@test(input="one round in this process: send_weights of 4 tensors (not in sorted order) in a "
      "thread, receive_weights into an engine of Parameters in another order, with a fifth "
      "weight the round does not send", timeout=30,
      hang="one side waits for a frame or descriptors the other never sends (check the order: "
           "JSON frame, fds, ack)")
def engine_copies_in_place(impl):
    ws = weights()  # and a fourth: not the other tests' count, and the names out of sorted order
    ws["lm_head.weight"] = torch.randn(6, 4, generator=torch.Generator().manual_seed(1))
    KEEP.append(ws)  # freed only at exit: a storage whose descriptor was closed aborts when freed
    target = {n: torch.nn.Parameter(torch.zeros(t.shape, dtype=t.dtype))
              for n, t in reversed(list(ws.items()))}
    target["extra.bias"] = torch.nn.Parameter(torch.ones(3))  # not in this round: stays as it is
    ids = {n: (id(t), t.data_ptr()) for n, t in target.items()}
    a, b = mp.Pipe()
    errors = []

    def trainer():
        try:
            impl.send_weights(a, ws)
        except BaseException as e:  # reported below
            errors.append(e)
    thread = threading.Thread(target=trainer, daemon=True)
    step("receive_weights(b, target) here, while send_weights(a, 4 tensors) runs in a thread")
    thread.start()
    try:
        with _MapWatch(impl, "receive_weights()") as watch:
            impl.receive_weights(b, target)
    except RuntimeError as e:
        raise Fail(f"receive_weights raised RuntimeError: {e}. The engine's weights are "
                   "Parameters that require grad: copy inside torch.no_grad()") from None
    except KeyError as e:
        raise Fail(f"receive_weights raised KeyError {e}: the engine has a weight the round "
                   "does not send ('extra.bias'); copy each tensor received, by its name, and "
                   "leave the others as they are") from None
    thread.join(ENGINE_WAIT_S)
    a.close()
    b.close()
    if errors:
        step("send_weights(a, 4 tensors), in the trainer's thread: it raised")
        raise errors[0]
    where = f"trainer order {list(ws)}, engine order {list(target)}"
    if not torch.equal(target["extra.bias"].detach(), torch.ones(3)):
        raise Fail("the engine's 'extra.bias', which the round does not send, changed")
    for n, t in ((n, t) for n, t in target.items() if n in ws):
        if (id(t), t.data_ptr()) != ids[n]:
            raise Fail(f"the engine's {n!r} is another tensor or another memory after the round: "
                       "copy into the engine's own tensor in place (copy_); rebinding target[name] "
                       "or its .data leaves the model's other references behind, and a view of "
                       "the trainer's memory changes with its next step",
                       expected="the same tensor object and data_ptr", got="a different one",
                       input=where)
        if not t.detach().any():
            raise Fail(f"the engine's {n!r} was never written: receive one descriptor per meta "
                       f"({len(ws)} here), and copy every tensor", input=where)
        if not torch.equal(t.detach(), ws[n]):
            raise Fail(f"the engine's {n!r} does not hold the trainer's {n!r}: copy by name, "
                       "and send the descriptors in the metas' order", input=where)
    engines = {own for own, _ in watch.kept}  # a number freed by the trainer, taken by map_fd
    closed = [n for n, t in ws.items() if impl.fd_of(t) in engines
              or _identity(impl.fd_of(t)) != _file_of_memory(t)]
    if closed:
        raise Fail("after send_weights the descriptors of the trainer's shared storages are "
                   "closed: fd_of's descriptor belongs to the storage (it hands out the same "
                   "number again next round, which by then may be another file)",
                   got=f"closed, or their numbers now name another file: {closed}")


def with_engine(impl, delay_s: float, body) -> None:
    """body(conn) with an engine process running serve_engine. Forked: it starts at once with
    torch already imported (a spawned one imports it first: seconds on a busy machine); the
    tensors of a round are made and shared after the fork, so it inherits none of their
    descriptors and maps only what comes over the pipe."""
    ctx = mp.get_context("fork")
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


class _TimeoutsElapse:
    """The trainer's end of the pipe, where every poll(t) with a limit answers at once, as
    if t had passed: the schedule of an engine slower than any limit the trainer picked.
    `timed_out` counts the polls that answered "nothing yet"; `changed` is notified of each."""

    def __init__(self, conn):
        self._conn, self.timed_out, self.changed = conn, 0, threading.Condition()

    def poll(self, timeout=0.0):
        ready = self._conn.poll(None if timeout is None else 0)
        if timeout is not None and not ready:
            with self.changed:
                self.timed_out += 1
                self.changed.notify_all()
        return ready

    def __getattr__(self, name):
        return getattr(self._conn, name)


@test(input="one round in this process; the engine holds before copying until the judge lets "
            "go; each poll(t) on the trainer's end answers at once, as if t had passed",
      timeout=30)
def ack_wait_has_no_limit(impl):
    ws = kept_weights()
    target = {n: torch.zeros(t.shape, dtype=t.dtype) for n, t in ws.items()}
    a, b = mp.Pipe()
    holding, release, returned = threading.Event(), threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def hold():
        holding.set()
        release.wait(ENGINE_WAIT_S)

    end = _TimeoutsElapse(a)

    def run(fn, *args):
        try:
            fn(*args)
        except BaseException as e:  # reported below
            errors.append(e)
        finally:
            if fn is impl.send_weights:
                with end.changed:
                    returned.set()
                    end.changed.notify_all()
    threads = [threading.Thread(target=run, args=(impl.send_weights, end, ws), daemon=True),
               threading.Thread(target=run, args=(impl.receive_weights, b, target, hold),
                                daemon=True)]
    for t in threads:
        t.start()
    try:
        if not holding.wait(ENGINE_WAIT_S):
            raise Fail(f"the engine's before_copy was not called within {ENGINE_WAIT_S:g} s of "
                       "the round's start")
        # The trainer returns, or polls again after a poll(t) said "nothing yet" (it waits on),
        # or blocks in recv_bytes (no poll: it has not returned a second later).
        went_on = lambda: returned.is_set() or end.timed_out >= 2  # noqa: E731
        with end.changed:
            end.changed.wait_for(went_on, scaled(1.0))
            if end.timed_out == 1:  # a limit just ran out: wait for what the trainer does next
                end.changed.wait_for(went_on, ENGINE_WAIT_S)
            early = returned.is_set()
    finally:
        release.set()
        for t in threads:
            t.join(ENGINE_WAIT_S)
        a.close()
        b.close()
    if early and not errors:
        raise Fail("send_weights returned while the engine was still copying and had not "
                   "acked: it waited for the ack with a time limit, then went on as if it had "
                   "come. The lifetime rule has no limit: wait for b'ack' itself "
                   "(conn.recv_bytes()), however slow the engine is",
                   got="returned before the ack")
    if errors:
        raise errors[0]


# --- the wire, as README.md fixes it: one JSON frame of metas, then the descriptors, then b"ack"
def _meta(name: str, t: torch.Tensor) -> dict:
    """A tensor's entry in the JSON frame, as README.md fixes it."""
    return {"name": name, "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
            "nbytes": t.untyped_storage().nbytes()}


def _judge_frame(sock) -> tuple[bytes, list[int]]:
    """One Connection frame read off the raw socket (a 4-byte big-endian length, then the
    bytes), and any descriptors that came with its first bytes."""
    head, fds, _, _ = socket.recv_fds(sock, 4, 64)
    while 0 < len(head) < 4:
        head += sock.recv(4 - len(head))
    size, data = int.from_bytes(head, "big") if len(head) == 4 else 0, b""
    while not fds and len(data) < size:
        data += sock.recv(size - len(data)) or b"?" * size  # EOF: fail on the content
    return data, fds


def _judge_receive(conn, ws) -> None:
    """The judge's engine side: the metas, then one descriptor each, mapped by its own mmap."""
    with socket.socket(fileno=os.dup(conn.fileno())) as sock:
        sock.settimeout(ENGINE_WAIT_S)
        data, fds = _judge_frame(sock)
        for fd in fds:
            os.close(fd)
        if fds:
            raise Fail("send_weights sent the descriptors before the JSON frame of metas: the "
                       "engine reads the metas first (conn.recv_bytes()), then the descriptors")
        metas = json.loads(data)
        check_equal(metas, [_meta(n, t) for n, t in ws.items()],
                    "the JSON frame of metas, as the judge's engine reads it")
        _, fds, _, _ = socket.recv_fds(sock, 1, len(metas))
    check_equal(len(fds), len(metas), "the descriptors after the metas (one per meta)")
    for meta, fd in zip(metas, fds):
        with mmap.mmap(fd, meta["nbytes"], prot=mmap.PROT_READ) as m:
            got = bytes(m)
        os.close(fd)
        if got != ws[meta["name"]].numpy().tobytes():
            raise Fail(f"descriptor {fds.index(fd)} does not map {meta['name']!r}'s memory: "
                       "send the descriptors in the metas' order")
    conn.send_bytes(b"ack")


def _judge_offer(conn, ws) -> None:
    """The judge's trainer side of a round: share, the metas, the descriptors."""
    for t in ws.values():
        t.share_memory_()
    metas = [_meta(n, t) for n, t in ws.items()]
    fds = [t.untyped_storage()._share_fd_cpu_()[0] for t in ws.values()]
    conn.send_bytes(json.dumps(metas).encode())
    with socket.socket(fileno=os.dup(conn.fileno())) as sock:
        socket.send_fds(sock, [b"F"], fds)


def _judge_send(conn, ws) -> None:
    """The judge's trainer side: a round, then wait for the ack."""
    _judge_offer(conn, ws)
    if not conn.poll(ENGINE_WAIT_S):
        raise Fail("your receive_weights sent no ack to the judge's trainer, which sent a JSON "
                   "frame of metas, then the descriptors (README.md's order)")
    check_equal(conn.recv_bytes(), b"ack", "the engine's reply to the judge's trainer")


@test(input="your send_weights against the judge's engine (raw socket: a JSON frame of metas, "
      "then one descriptor each, then b'ack'), and the judge's trainer against your "
      "receive_weights", timeout=30)
def wire_order(impl):
    ws, theirs = weights(), weights(fill=3.0)
    KEEP.extend([ws, theirs])  # freed only at exit (see engine_copies_in_place)
    target = {n: torch.zeros(t.shape, dtype=t.dtype) for n, t in theirs.items()}
    for side, (learner, args, judge, arg) in enumerate([
            (impl.send_weights, (ws,), _judge_receive, ws),
            (impl.receive_weights, (target,), _judge_send, theirs)]):
        a, b = mp.Pipe()
        thread = threading.Thread(target=learner, args=(a, *args), daemon=True)
        thread.start()
        try:
            judge(b, arg)
        finally:
            b.close()  # a learner still waiting for a frame gets EOF and returns
            thread.join(ENGINE_WAIT_S)
            a.close()
    check_equal(sums(target), sums(theirs), "your engine's weight sums after the judge's round")


def _take_round(conn) -> None:
    """The judge's engine reads a round (the metas, the descriptors) and closes what came."""
    conn.recv_bytes()
    with socket.socket(fileno=os.dup(conn.fileno())) as sock:
        _, fds, _, _ = socket.recv_fds(sock, 1, 64)
    for fd in fds:
        os.close(fd)


@test(input="your send_weights against a judge's engine that replies b'nak' instead of b'ack'; "
            "then against one that closes the pipe without a reply", timeout=30)
def no_ack_is_an_error(impl):
    ws = kept_weights()
    for reply, what in ((b"nak", "replied b'nak'"), (None, "closed the pipe without a reply")):
        a, b = mp.Pipe()
        outcome, done = [], threading.Event()

        def trainer():
            try:
                impl.send_weights(a, ws)
                outcome.append("it returned")
            except BaseException as e:  # what it raised is the verdict
                outcome.append(repr(e))
            done.set()
        threading.Thread(target=trainer, daemon=True).start()
        try:
            _take_round(b)
            if reply:
                b.send_bytes(reply)
        finally:
            b.close()
            finished = done.wait(ENGINE_WAIT_S)
            a.close()
        if not finished:
            raise Fail(f"send_weights neither returned nor raised after the engine {what}")
        if outcome[0] == "it returned":
            raise Fail(f"send_weights returned normally after the engine {what}: only b'ack' "
                       "says the engine has the weights; anything else must raise (a wrong "
                       "reply RuntimeError; recv_bytes's EOFError goes through)",
                       expected="an exception", got="it returned")


@test(input="the judge's trainer sends 3 tensors to your receive_weights in this process; the "
            "engine's 'norm' has shape [5] where the round sends [4], so copying it raises",
      timeout=30)
def failed_copy_is_not_acked(impl):
    ws = kept_weights()
    target = {n: torch.nn.Parameter(torch.zeros(t.shape, dtype=t.dtype)) for n, t in ws.items()}
    target["norm"] = torch.nn.Parameter(torch.zeros(5, dtype=torch.float64))
    a, b = mp.Pipe()
    try:
        _judge_offer(a, ws)
        try:
            impl.receive_weights(b, target)
            raised = None
        except Exception as e:  # what the copy raised, let through: right
            raised = e
        reply = a.recv_bytes() if a.poll(0) else None
    finally:
        a.close()
        b.close()
    where = "'norm': the round sends [4], the engine's weight is [5]"
    if reply == b"ack":
        raise Fail("receive_weights acked a round whose copy raised: the ack tells the trainer "
                   "the engine holds the new weights, and it does not. Send b'ack' only after "
                   "every copy succeeded (not in a finally, not after catching the error)",
                   expected="no ack, the copy's exception raised",
                   got=f"b'ack' ({'and ' + type(raised).__name__ if raised else 'and no error'})",
                   input=where)
    if raised is None:
        raise Fail("receive_weights returned normally although copying 'norm' raised: let the "
                   "exception through, so the engine's caller sees the round failed",
                   expected="the copy's exception", got=f"returned, reply {reply!r}",
                   input=where)
