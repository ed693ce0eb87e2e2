"""The judge's tests for exercise 402. Each receives the learner's module as `impl`.

The judge plays the front end: a ROUTER that the engine's input thread connects to, and a PULL
for its outputs, both real ZMQ sockets. The model is the judge's: it can hold a chosen step
inside execute until the test lets it go, so an abort lands mid-step every time, not by luck.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time

import msgspec
import zmq

from minivllm.judge import procfs
from minivllm.judge.api import Fail, check_equal, kill_if_alive, learner_frame, scaled, test
from minivllm.utils.zmq import IpcDir

WAIT_S = scaled(5.0)  # a message between threads or processes not here after this is lost
QUIET_S = 0.3  # how long a test listens where nothing should arrive
ID = b"\x00\x00"


class GatedModel:
    """token = position. The first call for which when(call number, batch) is true waits
    inside the model until the test releases it."""

    def __init__(self, when=lambda n, batch: False):
        self.when = when
        self.calls: list[dict[str, int]] = []
        self.gated_at = None  # the number of the call that waited
        self.entered, self.released = threading.Event(), threading.Event()

    def __call__(self, batch):
        self.calls.append(dict(batch))
        if self.gated_at is None and self.when(len(self.calls), batch):
            self.gated_at = len(self.calls)
            self.entered.set()
            if not self.released.wait(WAIT_S * 2):
                raise RuntimeError("the judge never released the model")
        return dict(batch)

    def wait_entered(self):
        if not self.entered.wait(WAIT_S):
            raise Fail("the busy loop never made the model call this test holds",
                       got=f"{len(self.calls)} calls: {self.calls}")


class FrontEnd:
    """The judge's front end: a ROUTER for engines' input threads, a PULL for their outputs,
    and what came out, decoded."""

    def __init__(self, identity=ID):
        self.id, self.ctx, self.d = identity, zmq.Context(), IpcDir()
        self.router, self.pull = self.ctx.socket(zmq.ROUTER), self.ctx.socket(zmq.PULL)
        for s in (self.router, self.pull):
            s.setsockopt(zmq.LINGER, 0)
        self.router.bind(self.d.path("in"))
        self.pull.bind(self.d.path("out"))
        self.tokens: dict[str, list[int]] = {}
        self.reasons: dict[str, list] = {}
        self.finished: list[str] = []
        self.messages: list[dict] = []  # every EngineCoreOutputs received, decoded

    def expect_readies(self, identities, what):
        got, deadline = [], time.monotonic() + WAIT_S
        while len(got) < len(identities):
            left = deadline - time.monotonic()
            if left <= 0 or not self.router.poll(int(left * 1000)):
                break
            got.append(self.router.recv_multipart())
        check_equal(sorted(got), [[i, b"READY"] for i in sorted(identities)], what)

    def add(self, rid, prompt_len, max_tokens, identity=None):
        self.router.send_multipart([identity or self.id, b"ADD", msgspec.msgpack.encode(
            {"request_id": rid, "prompt_token_ids": list(range(prompt_len)),
             "max_tokens": max_tokens})])

    def abort(self, ids):
        self.router.send_multipart([self.id, b"ABORT", msgspec.msgpack.encode(list(ids))])

    def collect(self, until, what, timeout=WAIT_S):
        deadline = time.monotonic() + timeout
        while not until():
            self.loop_died()
            left = deadline - time.monotonic()
            if left <= 0 or not self.pull.poll(int(min(left, 0.1) * 1000)):
                if time.monotonic() < deadline:
                    continue
                self.loop_died()
                raise Fail(f"waited {timeout:g} s for {what}", got=self.seen())
            self._take(msgspec.msgpack.decode(self.pull.recv()))

    def loop_died(self):
        """Fail naming what the busy loop raised, if it died (the cause, not the wait)."""

    def quiet(self):
        """Take what arrives within QUIET_S (where nothing more should)."""
        while self.pull.poll(int(QUIET_S * 1000)):
            self._take(msgspec.msgpack.decode(self.pull.recv()))

    def _take(self, outs):
        self.messages.append(outs)
        for o in outs["outputs"]:
            self.tokens.setdefault(o["request_id"], []).extend(o["new_token_ids"])
            self.reasons.setdefault(o["request_id"], []).append(o.get("finish_reason"))
        self.finished.extend(outs["finished_requests"])

    def seen(self):
        return {"tokens": self.tokens, "finished": self.finished}

    def close_front_end(self, term=True):
        self.router.close()
        self.pull.close()
        if term:
            self.ctx.term()
        self.d.close()


class Harness(FrontEnd):
    """The judge's front end around the learner's EngineCore, run_busy_loop in a thread."""

    def __init__(self, impl, model, num_blocks, identity=ID, may_raise=False):
        super().__init__(identity)
        self.impl, self.model, self.may_raise = impl, model, may_raise
        self.stuck = False  # a test saw run_busy_loop hang: closing does not wait for it again
        self.error = None  # what run_busy_loop raised
        self.engine = impl.EngineCore(self.d.path("in"), self.d.path("out"), model, num_blocks,
                                      identity)
        self.loop = threading.Thread(target=self._run_busy_loop, daemon=True)
        self.loop.start()
        self.expect_readies([identity], f"the first message from the engine (identity "
                            f"{identity!r}, then READY: its DEALER connects and sends it first)")

    def loop_died(self):
        if self.error is not None and not self.may_raise:
            where = learner_frame(self.error.__traceback__, os.path.dirname(self.impl.__file__))
            raise Fail(f"run_busy_loop raised {type(self.error).__name__}: {self.error}"
                       + (f", in {where}" if where else "") + ". The busy loop died; nothing "
                       "after it was served", got=self.seen())

    def _run_busy_loop(self):
        try:
            self.engine.run_busy_loop()
        except BaseException as e:  # noqa: BLE001 (close() reports it)
            self.error = e

    def during_held_step(self, first, adds=(), aborts=()):
        """ADD `first`, which the model holds in its step; meanwhile send `adds`, then
        `aborts`; once the input thread queued them all, release the model."""
        self.add(*first)
        self.model.wait_entered()
        for args in adds:
            self.add(*args)
        for ids in aborts:
            self.abort(ids)
        self.wait_queue("input_queue", len(adds) + len(aborts))
        self.model.released.set()

    def wait_queue(self, name, n):
        q = getattr(self.engine, name)
        deadline = time.monotonic() + WAIT_S
        while q.qsize() < n:
            if name == "input_queue" and self._abort_only_on_aborts_queue():
                deadline = min(deadline, time.monotonic() + scaled(0.5))  # its other put is due
            if time.monotonic() > deadline:
                if name == "input_queue" and self._abort_only_on_aborts_queue():
                    raise Fail("an ABORT reached aborts_queue but not input_queue: the input "
                               "thread puts every ABORT on both (aborts_queue for the step in "
                               "progress; input_queue in order with the ADDs, for an abort "
                               "that comes while its request is still behind its ADD there)",
                               expected="('ABORT', ids) on input_queue too",
                               got=f"input_queue {self._kinds(q)}, aborts_queue "
                                   f"{list(self.engine.aborts_queue.queue)}")
                raise Fail(f"engine.{name} holds {q.qsize()} items while the busy loop is inside "
                           f"the model; expected {n}: the input thread must decode and queue "
                           "messages on its own, whatever the busy loop is doing")
            time.sleep(0.005)

    @staticmethod
    def _kinds(q) -> list:
        with q.mutex:
            return [item[0] if isinstance(item, tuple) and item else item for item in q.queue]

    def _abort_only_on_aborts_queue(self) -> bool:
        """aborts_queue holds ids while input_queue holds no ABORT."""
        return (self.engine.aborts_queue.qsize() > 0
                and not {b"ABORT", "ABORT"} & set(self._kinds(self.engine.input_queue)))

    def close(self, wait=WAIT_S):
        try:
            self.router.send_multipart([self.id, b"SHUTDOWN"])
            self.loop.join(wait if self.loop.is_alive() and not self.stuck else 0)
            if self.loop.is_alive():
                raise Fail("run_busy_loop did not return within "
                           f"{WAIT_S:g} s of [b'SHUTDOWN']")
            if self.error is not None and not self.may_raise:
                raise Fail(f"run_busy_loop raised {self.error!r} (the model raised nothing): at "
                           "[b'SHUTDOWN'] it must return, after its finally's shutdown()")
        finally:
            self.close_front_end()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        self.model.released.set()
        if exc_type is None:
            self.close()
        else:  # report the first failure (in the test's time), not a shutdown failing after it
            try:
                self.close(wait=scaled(1.0))
            except Fail:
                pass


def _expect_tokens(h, rid, prompt_len, n):
    check_equal(h.tokens.get(rid), list(range(prompt_len, prompt_len + n)),
                f"the tokens of {rid} (the judge's model: token = position)")


@test(input="identity b'\\x07\\x01'; ADD r0 (prompt 3 tokens, max_tokens 5); 8 blocks of 4 tokens")
def generates_and_finishes(impl):
    with Harness(impl, GatedModel(), 8, identity=b"\x07\x01") as h:
        h.add("r0", 3, 5)
        h.collect(lambda: "r0" in h.finished, "r0 to finish")
        _expect_tokens(h, "r0", 3, 5)
        check_equal(h.reasons["r0"], [None] * 4 + ["length"],
                    "finish_reason of each output of r0 ('length' on the last only)")
        check_equal(h.finished, ["r0"], "finished_requests, all outputs together")
        last = next(m for m in h.messages if any(o["finish_reason"] for o in m["outputs"]))
        check_equal(last["finished_requests"], ["r0"], "finished_requests of the output that "
                    "carries r0's last token (a request that finishes in a step is reported in "
                    "that step's output, not the next)")
        check_equal(h.engine.block_pool.num_free, 8, "block_pool.num_free after r0 finished")


@test(input="the model holds step 1 (r0); meanwhile ADD r1 and ABORT ['x'] arrive")
def input_thread_decodes_while_busy(impl):
    model = GatedModel(lambda n, batch: n == 1)
    with Harness(impl, model, 8) as h:
        h.add("r0", 2, 3)
        model.wait_entered()
        h.add("r1", 2, 2)
        h.abort(["x"])
        h.wait_queue("input_queue", 2)
        h.wait_queue("aborts_queue", 1)
        model.released.set()
        h.collect(lambda: {"r0", "r1"} <= set(h.finished), "r0 and r1 to finish")
        _expect_tokens(h, "r1", 2, 2)
        check_equal(sorted(h.finished), ["r0", "r1"], "finished_requests ('x' was never "
                                                      "there: aborting it reports nothing)")


@test(input="r0 (max 10) and r1 (max 4) run; the model holds the step where r0 has 2 tokens; "
            "ABORT ['r0'] arrives during it; the model returns a token for r0 all the same")
def abort_during_execute(impl):
    model = GatedModel(lambda n, batch: batch.get("r0") == 4)  # r0 has 2 of its tokens
    with Harness(impl, model, 8) as h:
        h.add("r0", 2, 10)
        h.add("r1", 2, 4)
        model.wait_entered()
        h.abort(["r0"])
        h.wait_queue("aborts_queue", 1)
        model.released.set()
        h.collect(lambda: {"r0", "r1"} <= set(h.finished), "r0 (aborted) and r1 to finish")
        h.quiet()
        got = h.tokens.get("r0", [])
        if len(got) > 2:
            raise Fail("r0's token from the step during which its abort arrived was emitted: "
                       "apply the aborts queue after execute and before update, and drop the "
                       "tokens of requests that are gone", expected=[2, 3], got=got)
        check_equal(got, [2, 3], "r0's tokens (the two from before the held step)")
        check_equal(h.finished.count("r0"), 1, "how often r0 is in finished_requests")
        late = [c for c in model.calls[model.gated_at:] if "r0" in c]
        check_equal(late, [], "model calls after the abort whose batch holds r0")
        _expect_tokens(h, "r1", 2, 4)
        check_equal(h.engine.block_pool.num_free, 8,
                    "block_pool.num_free at the end (an aborted request frees its blocks)")


@test(input="the model holds step 1 (r0, max_tokens 2); ADD r1 and ABORT ['r1'] arrive, in that "
            "order, during it")
def abort_right_after_add(impl):
    model = GatedModel(lambda n, batch: n == 1)
    with Harness(impl, model, 8) as h:
        h.during_held_step(("r0", 2, 2), adds=[("r1", 2, 5)], aborts=[["r1"]])
        h.collect(lambda: "r0" in h.finished or "r1" in h.tokens, "r0 to finish")
        h.quiet()
        ran = [c for c in model.calls if "r1" in c]
        if ran or "r1" in h.tokens:
            raise Fail("r1 ran after its abort: an ABORT must reach its request wherever it is "
                       "(still behind its ADD in input_queue, so apply input_queue in order; or "
                       "waiting for blocks)", got={"model calls": ran,
                                                  "tokens": h.tokens.get("r1")})
        if "r1" not in h.finished:
            raise Fail("r1, aborted while it waited (its ADD, then its ABORT, applied from "
                       "input_queue before r0's last step), was never reported: an aborted "
                       "request, waiting or running, is reported once in the next output's "
                       "finished_requests", expected="r1 in finished_requests by the output "
                       "that finishes r0", got=h.seen())
        check_equal(sorted(h.finished), ["r0", "r1"], "finished_requests")


@test(input="8 blocks of 4 tokens; the model holds step 1 (rh: 1 block); meanwhile ADD r0 "
            "(2 blocks), r1 (6 blocks), r2 (1 block), in that order", timeout=20)
def admits_in_order(impl):
    model = GatedModel(lambda n, batch: n == 1)
    with Harness(impl, model, 8) as h:
        h.during_held_step(("rh", 1, 3), adds=[("r0", 4, 4), ("r1", 4, 20), ("r2", 1, 2)])
        h.collect(lambda: {"rh", "r0", "r1", "r2"} <= set(h.finished), "all four to finish",
                  timeout=WAIT_S * 2)
        check_equal(sorted(model.calls[1]), ["r0", "rh"],
                    "the requests in step 2 (7 blocks free: r0 takes 2; r1 needs 6 of the 5 "
                    "left and waits, and r2, behind it, waits too: waiting requests are "
                    "admitted in order, and admission stops at the first that does not fit)")
        first = [next(i for i, c in enumerate(model.calls) if r in c) for r in ("r1", "r2")]
        if first[0] > first[1]:
            raise Fail("r2 ran before r1, which was added before it: admit in arrival order",
                       got={"first step of r1": first[0], "first step of r2": first[1]})
        for rid, plen, mt in [("r0", 4, 4), ("r1", 4, 20), ("r2", 1, 2)]:
            _expect_tokens(h, rid, plen, mt)


@test(input="3 blocks; r0 takes all 3; r1 waits for blocks; during r0's step 2: ABORT "
            "['r1', 'ghost'] and ABORT ['r1']; after r0 finished: ABORT ['r0'], then ADD r0 "
            "again (prompt 1, max 2)")
def abort_waiting_is_idempotent(impl):
    model = GatedModel(lambda n, batch: n == 2)
    with Harness(impl, model, 3) as h:
        h.add("r0", 4, 8)
        h.add("r1", 1, 2)
        model.wait_entered()
        h.abort(["r1", "ghost"])
        h.abort(["r1"])
        h.wait_queue("aborts_queue", 2)
        model.released.set()
        h.collect(lambda: "r0" in h.finished, "r0 to finish")
        h.abort(["r0"])
        h.quiet()
        check_equal(sorted(h.finished), ["r0", "r1"],
                    "finished_requests: r1 once (aborted while waiting; aborting twice is one "
                    "abort), 'ghost' never (unknown), r0 once (its late abort is ignored)")
        ran = [c for c in model.calls if "r1" in c]
        check_equal(ran, [], "model calls with r1 (aborted before it got blocks)")
        _expect_tokens(h, "r0", 4, 8)
        check_equal(h.engine.block_pool.num_free, 3, "block_pool.num_free at the end")
        h.add("r0", 1, 2)  # the id comes back; the late ABORT ['r0'] must not touch it
        h.collect(lambda: h.finished.count("r0") == 2, "the new r0 to finish")
        check_equal(h.tokens["r0"][8:], [1, 2], "the tokens of a new r0 added after the late "
                    "ABORT ['r0'] (the idle loop empties aborts_queue: that abort was applied "
                    "from input_queue already)")


@test(input="r0 finished; the front end closes its PULL; ADD r1 (3 tokens), whose outputs "
            "now have no reader; [b'SHUTDOWN']", timeout=20)
def shutdown_with_front_end_gone(impl):
    with Harness(impl, GatedModel(), 8) as h:
        h.add("r0", 1, 2)
        h.collect(lambda: "r0" in h.finished, "r0 to finish")
        h.pull.close()  # the front end's output side is gone
        time.sleep(scaled(QUIET_S))  # let the engine's PUSH see its peer go
        h.add("r1", 1, 3)
        deadline = time.monotonic() + WAIT_S
        while sum("r1" in c for c in h.model.calls) < 3 or h.engine.output_queue.qsize():
            if time.monotonic() > deadline:
                raise Fail(f"within {WAIT_S:g} s r1 did not run its 3 steps and output_queue "
                           "did not empty (the output thread sends each output, even with no "
                           "reader)", got={"model calls": h.model.calls,
                                           "output_queue": h.engine.output_queue.qsize()})
            time.sleep(0.005)
        h.router.send_multipart([h.id, b"SHUTDOWN"])
        h.loop.join(WAIT_S)
        if h.loop.is_alive():
            h.stuck = True
            raise Fail(f"run_busy_loop did not return within {WAIT_S:g} s of [b'SHUTDOWN'] "
                       "while r1's outputs had no reader (the front end's PULL was closed): a "
                       "PUSH with the default LINGER (-1) keeps ctx.term() waiting forever for "
                       "a peer that is gone; give the PUSH a finite LINGER")


@test(input="an engine with one finished request; [b'SHUTDOWN']")
def shutdown_joins_threads(impl):
    with _nothing_left_after("run_busy_loop returned"):
        h = Harness(impl, GatedModel(), 4)
        try:
            h.add("r0", 1, 2)
            h.collect(lambda: "r0" in h.finished, "r0 to finish")
        finally:
            h.close()


@contextlib.contextmanager
def _nothing_left_after(when):
    """Fail if the block leaves a thread running or a descriptor open (once it ends normally)."""
    before_threads, before_fds = set(threading.enumerate()), procfs.fd_count()
    yield
    deadline = time.monotonic() + WAIT_S
    while set(threading.enumerate()) - before_threads and time.monotonic() < deadline:
        time.sleep(0.01)
    left = [t.name for t in set(threading.enumerate()) - before_threads]
    if left:
        raise Fail(f"threads still running after {when}: stop the IO threads (a flag the "
                   "input thread polls; a sentinel on output_queue) and join them", got=left)
    fds = procfs.fd_count() - before_fds
    if fds > 0:
        raise Fail(f"{fds} file descriptors left open after {when}: each thread closes its "
                   "socket, then ctx.term()", expected=0, got=fds)


class FailingModel(GatedModel):
    def __call__(self, batch):
        super().__call__(batch)
        raise RuntimeError("the judge's model failed (as a CUDA error would)")


@test(input="ADD r0; the model raises RuntimeError in its first call", timeout=30)
def model_error_shuts_down(impl):
    with _nothing_left_after("run_busy_loop ended with the model's error (call shutdown() in "
                             "a finally)"):
        h = Harness(impl, FailingModel(), 4, may_raise=True)
        try:
            h.add("r0", 1, 2)
            h.loop.join(WAIT_S)
            if not h.model.calls:
                raise Fail(f"the busy loop did not call the model within {WAIT_S:g} s of ADD r0")
        finally:
            h.close()  # SHUTDOWN, in case run_busy_loop went on after the error


@test(input="two engines side by side, each with its own front end: SHUTDOWN to the first, "
            "then ADD r0 (prompt 1, max 2) to the second", timeout=30)
def two_engines(impl):
    with Harness(impl, GatedModel(), 4) as b, Harness(impl, GatedModel(), 4) as a:
        a.router.send_multipart([a.id, b"SHUTDOWN"])
        a.loop.join(WAIT_S)
        if a.loop.is_alive():
            a.stuck = b.stuck = True
            raise Fail(f"the first engine's run_busy_loop did not return within {WAIT_S:g} s of "
                       "[b'SHUTDOWN'] while a second engine was running: its ctx.term() waits "
                       "for the other engine's sockets. Each EngineCore makes its own "
                       "zmq.Context(), never the process-wide Context.instance()")
        b.add("r0", 1, 2)
        b.collect(lambda: "r0" in b.finished, "r0 to finish on the second engine")
        _expect_tokens(b, "r0", 1, 2)


class BareEngine(FrontEnd):
    """The learner's EngineCore with no busy loop (the test calls it) and a front end for its IO
    threads; leaving the `with` shuts it down, unless `stuck`. Threads started while it is open
    run `hold` as their trace."""

    def __init__(self, impl, model, num_blocks, hold=None):
        super().__init__()
        self.stuck, self.engine, self.hold = False, None, hold
        if hold is not None:  # until __exit__: a thread may read the hook after start() returned
            threading.settrace(hold)
        try:
            self.engine = impl.EngineCore(self.d.path("in"), self.d.path("out"), model, num_blocks)
        except BaseException:
            self.__exit__()
            raise

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        threading.settrace(None)
        if self.hold is not None:
            self.hold.release.set()
        if self.engine is not None and not self.stuck:
            self.engine.shutdown()
        self.close_front_end(term=not self.stuck)


@test(input="no busy loop, no identity given: the test calls add_request(r0: prompt 2, max 3), "
            "step(), abort_requests(['ghost', 'r0']), step(), abort_requests(['r0']) itself; "
            "4 blocks")
def abort_between_steps(impl):
    model = GatedModel()
    before = set(threading.enumerate())
    with BareEngine(impl, model, 4) as b:
        engine = b.engine
        started = [t.name for t in set(threading.enumerate()) - before if not t.daemon]
        if started:
            raise Fail("the engine started threads that are not daemon threads: a program that "
                       "drives it with step() and ends without shutdown() would wait for them "
                       "for ever at exit (the README: both IO threads are daemons, as in vLLM)",
                       got=started)
        b.expect_readies([ID], "the first message from an engine made without an identity "
                         "(the default identity is b'\\x00\\x00')")
        engine.add_request(impl.EngineCoreRequest("r0", [0, 1], 3))
        check_equal([o.new_token_ids for o in engine.step().outputs], [[2]], "r0's first step")
        check_equal(engine.abort_requests(["ghost", "r0"]), ["r0"], "abort_requests(['ghost', "
                    "'r0']) with r0 running (an unknown id is skipped: the ids after it are "
                    "still aborted)")
        if not engine.has_work():
            raise Fail("has_work() is False right after r0 was aborted: its finished id is not "
                       "reported yet, so the busy loop must step once more to send it")
        out = engine.step()
        check_equal((out.outputs, out.finished_requests, model.calls[1:]), ([], ["r0"], []),
                    "(outputs, finished_requests, model calls) of the step after the abort "
                    "(nothing runs: no model call)")
        check_equal((engine.has_work(), engine.abort_requests(["r0"]),
                     engine.block_pool.num_free), (False, [], 4),
                    "(has_work(), abort_requests(['r0']) again, block_pool.num_free)")


class HoldAtReturn:
    """A trace for threading.settrace: holds the thread running the method `name` when that
    method returns (its finally done), until `release` is set."""

    def __init__(self, name):
        self.name, self.held, self.release = name, threading.Event(), threading.Event()

    def __call__(self, frame, event, arg):
        return self._local if frame.f_code.co_name == self.name else None

    def _local(self, frame, event, arg):
        if event == "return":
            self.held.set()
            self.release.wait(WAIT_S * 2)
        return self._local


@test(input="no busy loop: the judge holds output_queue's lock, queues 3 EngineCoreOutputs (r0, "
            "r1, r2) behind the output thread's back, calls shutdown(), and lets go once "
            "shutdown() waits; it holds the output thread when process_output_socket returns")
def shutdown_sends_what_is_queued(impl):
    hold = HoldAtReturn("process_output_socket")
    with BareEngine(impl, GatedModel(), 4, hold=hold) as b:
        q, closer = b.engine.output_queue, None
        with q.mutex:  # the output thread cannot take anything until the judge lets go
            for i in range(3):
                q.queue.append(impl.EngineCoreOutputs([impl.EngineCoreOutput(f"r{i}", [i])], []))
                q.unfinished_tasks += 1
            q.not_empty.notify()
            closer = threading.Thread(target=b.engine.shutdown, name="judge-shutdown",
                                      daemon=True)
            closer.start()
            _wait_until_in(closer, ("put", "join"))
        if hold.held.wait(WAIT_S):  # the output thread has closed its PUSH and is held
            _wait_until_in(closer, ("join",))
            if not closer.is_alive():
                raise Fail("shutdown() returned while the output thread was still running (the "
                           "judge held it as process_output_socket returned): join both IO "
                           "threads before ctx.term()")
        hold.release.set()
        closer.join(WAIT_S)
        if closer.is_alive():
            b.stuck = True
            raise Fail(f"shutdown() did not return within {WAIT_S:g} s with 3 outputs queued")
        got = []
        while len(got) < 3 and b.pull.poll(int(WAIT_S * 1000)):
            got += [o["request_id"] for o in msgspec.msgpack.decode(b.pull.recv())["outputs"]]
        if got != ["r0", "r1", "r2"]:
            raise Fail("3 outputs were on output_queue when shutdown() was called; the front end "
                       f"received {len(got)}: the output thread must send what is queued before "
                       "it stops (stop at the None sentinel that shutdown() queues behind them, "
                       "not at a stop flag)", expected=["r0", "r1", "r2"], got=got)
        if not hold.held.is_set():
            raise Fail("the output thread never returned from process_output_socket: run it "
                       "as the output thread's target (the README names it)")


def _wait_until_in(thread, names):
    """Wait until `thread` waits in a queue's or threading's function named in `names` (put:
    shutdown() queueing None; join), or ends."""
    deadline = time.monotonic() + WAIT_S
    while thread.is_alive() and time.monotonic() < deadline:
        frame = sys._current_frames().get(thread.ident)
        while frame is not None:
            code = frame.f_code
            if code.co_name in names and code.co_filename.endswith(("queue.py", "threading.py")):
                return
            frame = frame.f_back
        time.sleep(0.005)


@test(input="no busy loop: add_request r0, then r1 (prompt 2, max 3 each), 8 blocks; step() "
            "twice; this model answers 100 + position, and inside its second call puts ['r0'] "
            "on aborts_queue (as the input thread does when an ABORT arrives during execute)")
def abort_in_step_skips_only_it(impl):
    calls = []

    def model(batch):
        calls.append(dict(batch))
        if len(calls) == 2:
            b.engine.aborts_queue.put(["r0"])
        return {rid: 100 + pos for rid, pos in batch.items()}

    with BareEngine(impl, model, 8) as b:
        for rid in ("r0", "r1"):
            b.engine.add_request(impl.EngineCoreRequest(rid, [0, 1], 3))
        got = [(o.request_id, o.new_token_ids) for o in b.engine.step().outputs]
        check_equal(got, [("r0", [102]), ("r1", [102])], "the outputs of step 1 (this model's "
                    "token is 100 + position: emit the token the model sampled, not the "
                    "position it was given)")
        out = b.engine.step()
        got = [(o.request_id, o.new_token_ids) for o in out.outputs]
        if got != [("r1", [103])]:
            raise Fail("the outputs of the step during which r0 was aborted: r0's token is "
                       "dropped, and r1's, after it in the same step, is still emitted: skip an "
                       "aborted request in the update (continue), do not stop at it",
                       expected=[("r1", [103])], got=got)
        check_equal(out.finished_requests, ["r0"], "finished_requests of that step")
        check_equal(b.engine.running["r1"].output, [102, 103], "engine.running['r1'].output "
                    "after two steps (the update appends each sampled token to the Request)")


SERVE = "import {module} as m; m.serve({inp!r}, {out!r}, 4{identity})"


@test(input="two engine processes, each running serve() with 4 blocks, on one front end (one "
            "ROUTER, one PULL): one with no identity given, one with b'\\x01\\x00'; ADD a "
            "(prompt 1, max 2) to the first, b (prompt 2, max 2) to the second; [b'SHUTDOWN'] to "
            "each", timeout=30)
def serve_two_engine_processes(impl):
    fe, ids, procs = FrontEnd(), [ID, b"\x01\x00"], []
    try:
        for identity in ("", ", b'\\x01\\x00'"):
            code = SERVE.format(module=impl.__name__, inp=fe.d.path("in"),
                                out=fe.d.path("out"), identity=identity)
            procs.append(subprocess.Popen([sys.executable, "-c", code], text=True,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        fe.expect_readies(ids, "the READYs of the two engine processes (serve gives EngineCore "
                          "the identity it is given; with none, b'\\x00\\x00')")
        fe.add("a", 1, 2, identity=ids[0])
        fe.add("b", 2, 2, identity=ids[1])
        fe.collect(lambda: len(fe.finished) == 2, "a and b to finish")
        check_equal(fe.tokens, {"a": [1, 2], "b": [2, 3]}, "the tokens from the two engine "
                    "processes (echo_model: token = position)")
        for identity, proc in zip(ids, procs):
            fe.router.send_multipart([identity, b"SHUTDOWN"])
            try:
                _, err = proc.communicate(timeout=WAIT_S)
            except subprocess.TimeoutExpired:
                raise Fail(f"the engine process {identity!r} still ran {WAIT_S:g} s after "
                           "[b'SHUTDOWN']") from None
            if proc.returncode != 0:
                raise Fail(f"the engine process {identity!r} exited with code "
                           f"{proc.returncode} after [b'SHUTDOWN']", expected=0,
                           got=proc.returncode, detail=err[-2000:])
    finally:
        kill_if_alive(*procs)
        fe.close_front_end()
