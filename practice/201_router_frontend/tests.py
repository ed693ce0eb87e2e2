"""The judge's tests for exercise 201. Each receives the learner's module as `impl`.

The judge's own engines are threads with real DEALER/PUSH sockets; the learner's engines run
in real processes (`python -c "import router_frontend; ..."`). Every address is an ipc:// file
in a private directory under the judge's $TMPDIR.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import re
import subprocess
import sys
import threading
import time

import zmq

from minivllm.judge import procfs
from minivllm.judge.api import EngineBench, Fail, check_equal, kill_if_alive, scaled, step, test
from minivllm.judge.polls import PollLog, check_polls_time_left
from minivllm.utils.zmq import IpcDir

WAIT_S = scaled(1.5)  # a message between threads on one host not delivered in this long was dropped
START_S = scaled(10.0)  # a fresh Python process importing zmq is ready well within this
STOP_S = scaled(3.0)  # an engine told to stop (or idle for 0.5 s) exits well within this
S = scaled(1.0)  # the trickles below stretch with the judge's time limits (polls.POLL_SLACK_S)
TRICKLE_AT = (0.3, 0.6, 0.9, 3.0, 3.3)  # x S: three outputs before a 1.2 x S deadline, two after
FROZEN_TIMEOUTS = (2.0, 0.0005, 0.0)  # timeouts tried on a clock that stands still (polls.py)
ID = {0: b"\x00\x00", 1: b"\x01\x00", 2: b"\x02\x00"}  # the identities, spelled out


class JudgeEngine(threading.Thread):
    """A correct engine: connects after `delay` s (None: once `go` is set), says READY, reverses
    prompts, records them. A `deaf` one says READY, then reads nothing until stopped (hung)."""

    def __init__(self, ctx, rank, d, delay=0.0, readies=1, deaf=False):
        super().__init__(daemon=True)
        self.ctx, self.rank, self.d, self.delay, self.readies = ctx, rank, d, delay, readies
        self.deaf = deaf
        self.requests: list[str] = []
        self.stop, self.go = threading.Event(), threading.Event()
        self.start()

    def run(self):
        if self.delay is None:
            while not self.go.wait(0.02):
                if self.stop.is_set():
                    return
        elif self.stop.wait(self.delay):
            return
        dealer, push = self.ctx.socket(zmq.DEALER), self.ctx.socket(zmq.PUSH)
        dealer.setsockopt(zmq.IDENTITY, ID[self.rank])
        for s in (dealer, push):
            s.setsockopt(zmq.LINGER, 0)
        if self.deaf:  # takes 1 message off the wire, so the front end's queue never drains
            dealer.setsockopt(zmq.RCVHWM, 1)
        dealer.connect(self.d.path("in"))
        push.connect(self.d.path("out"))
        for _ in range(self.readies):  # more than one: an engine that reconnected
            dealer.send(b"READY")
        try:
            if self.deaf:
                self.stop.wait()
            while not self.stop.is_set():
                if not dealer.poll(20):
                    continue
                frames = dealer.recv_multipart()
                if frames == [b"STOP"]:
                    return
                _, rid, prompt = frames
                self.requests.append(rid.decode())
                push.send_multipart([ID[self.rank], rid, prompt[::-1]])
        finally:
            dealer.close()
            push.close()

    def wait_for(self, n, timeout=WAIT_S):
        deadline = time.monotonic() + timeout
        while len(self.requests) < n and time.monotonic() < deadline:
            time.sleep(0.01)


class Bench(EngineBench):
    """A learner FrontEnd plus judge engines; closes everything whatever the test did."""

    def __init__(self, impl, n_engines, delays, readies=1, deaf=False):
        super().__init__()
        self.fe = self.learner = impl.FrontEnd(self.d.path("in"), self.d.path("out"), n_engines)
        self.engines = [JudgeEngine(self.ctx, r, self.d, delay, readies, deaf)
                        for r, delay in enumerate(delays)]


def _engine_process(impl, rank, d, idle_timeout=30.0):
    code = (f"import {impl.__name__} as m; "
            f"m.run_engine({rank}, {d.path('in')!r}, {d.path('out')!r}, {idle_timeout})")
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def _finish(proc, what):
    """Wait for an engine process to exit by itself; kill it and fail if it does not."""
    try:
        _, err = proc.communicate(timeout=STOP_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise Fail(f"{what}, the engine process was still running {STOP_S:g} s later. It must "
                   "return, closing its sockets with a bounded linger: with the default linger, "
                   "ctx.term() waits forever for messages that nobody will read.")
    if proc.returncode != 0:
        raise Fail(f"{what}, the engine process exited with code {proc.returncode}",
                   expected=0, got=proc.returncode, detail=err[-2000:])


@test(input="engine_identity(r) for r in 0, 3, 258, 65535; rank_of of each; -1, 65536, b'\\x03', "
      "b'\\x03\\x00\\x00'")
def identity(impl):
    for rank, ident in [(0, b"\x00\x00"), (3, b"\x03\x00"), (258, b"\x02\x01"),
                        (65535, b"\xff\xff")]:
        check_equal(impl.engine_identity(rank), ident,
                    f"engine_identity({rank}) (2 bytes, little endian)")
        check_equal(impl.rank_of(ident), rank, f"rank_of({ident!r})")
    for bad, call in [(-1, impl.engine_identity), (65536, impl.engine_identity),
                      (b"\x03", impl.rank_of), (b"\x03\x00\x00", impl.rank_of)]:
        try:
            call(bad)
        except ValueError:
            continue
        raise Fail(f"{call.__name__}({bad!r}) must raise ValueError", input=repr(bad))


@test(input="FrontEnd(ipc in, ipc out, 1); close(); close()")
def close_removes_socket_files(impl):
    with IpcDir() as d:
        before = procfs.fd_count()
        fe = impl.FrontEnd(d.path("in"), d.path("out"), 1)
        files = [os.path.join(d.dir, n) for n in ("in", "out")]
        for f in files:
            if not os.path.exists(f):
                raise Fail(f"FrontEnd() must bind its ROUTER and PULL: {f} does not exist")
        fe.close()
        left = [f for f in files if os.path.exists(f)]
        if left:
            raise Fail("after close() these socket files still exist: libzmq 4.3 does not "
                       "remove the file of a bound ipc:// socket; close() must os.unlink it",
                       got=left)
        opened = procfs.fd_count() - before
        if opened > 0:
            raise Fail(f"close() left {opened} file descriptors open: close both sockets and "
                       "terminate the context (ctx.term())", expected=0, got=opened)
        fe.close()


# The deaf engine's DEALER holds 1 message (RCVHWM 1) and the kernel a few more; the rest stay
# queued in the front end's ROUTER (its SNDHWM is 1000, so none is dropped), whatever the schedule.
STUCK_MESSAGES, STUCK_BYTES = 300, 65536


@test(input=f"1 engine says READY, then reads nothing (hung); {STUCK_MESSAGES} requests of "
            f"{STUCK_BYTES} bytes to it; close()", timeout=30)
def close_with_a_stuck_engine(impl):
    with Bench(impl, 1, [0], deaf=True) as b:
        b.fe.wait_ready(START_S)
        for i in range(STUCK_MESSAGES):
            b.fe.add_request(f"s{i}", b"x" * STUCK_BYTES)
        closing = threading.Thread(target=b.fe.close, daemon=True)
        closing.start()
        closing.join(scaled(5.0))
        if closing.is_alive():
            b.engines[0].stop.set()  # the engine leaves: its queued requests go, close() returns
            closing.join(STOP_S)
            raise Fail(f"close() had not returned {scaled(5.0):g} s after it began, with "
                       "requests queued for an engine that stopped reading: ctx.term() waits "
                       "for them as long as the ROUTER's linger says, forever by default. Set "
                       "a bounded zmq.LINGER (vLLM uses 0) on the front end's sockets")


@contextlib.contextmanager
def _judge_front(impl, rank, idle_timeout=30.0):
    """The judge's ROUTER and PULL, bound, and your run_engine(rank) in a process; on the way
    out the process is killed if it still runs, and everything is closed."""
    ctx, d = zmq.Context(), IpcDir()
    router, pull = ctx.socket(zmq.ROUTER), ctx.socket(zmq.PULL)
    for s in (router, pull):
        s.setsockopt(zmq.LINGER, 0)
    router.bind(d.path("in"))
    pull.bind(d.path("out"))
    proc = _engine_process(impl, rank, d, idle_timeout)
    try:
        yield router, pull, proc
    finally:
        kill_if_alive(proc)
        router.close()
        pull.close()
        ctx.term()
        d.close()


@test(input="run_engine(2, ...) in a process; the judge's ROUTER and PULL; ADD r1 'hello', "
            "ADD r2 'abc', ADD r3 '' (an empty prompt), STOP", timeout=25,
      hang="run_engine did not return after STOP: return when frames == [b'STOP'].")
def engine_says_ready_first(impl):
    with _judge_front(impl, 2) as (router, pull, proc):
        if not router.poll(int(START_S * 1000)):
            raise Fail(f"no message from engine 2 within {START_S:g} s: the engine must send "
                       "[b'READY'] first, so that the ROUTER learns its identity",
                       expected=[ID[2], b"READY"], got="nothing")
        check_equal(router.recv_multipart(), [ID[2], b"READY"],
                    "the first message the ROUTER receives: [identity, b'READY'] (set the "
                    "DEALER's IDENTITY before connect)")
        router.send_multipart([ID[2], b"ADD", b"r1", b"hello"])
        router.send_multipart([ID[2], b"ADD", b"r2", b"abc"])
        router.send_multipart([ID[2], b"ADD", b"r3", b""])
        outputs = [pull.recv_multipart() if pull.poll(int(WAIT_S * 1000)) else "nothing"
                   for _ in range(3)]
        check_equal(outputs, [[ID[2], b"r1", b"olleh"], [ID[2], b"r2", b"cba"], [ID[2], b"r3", b""]],
                    "the outputs on the PULL: [identity, request_id, prompt[::-1]] per ADD, "
                    "an empty prompt too")
        router.send_multipart([ID[2], b"STOP"])
        _finish(proc, "after STOP")


@test(input="the signature of run_engine; run_engine(0, ..., idle_timeout=0.5) with nothing bound "
            "at either address; then run_engine(0, ..., idle_timeout=0) in this process, its "
            "DEALER's linger recorded at close", timeout=20)
def engine_gives_up(impl):
    check_equal(inspect.signature(impl.run_engine).parameters["idle_timeout"].default, 30.0,
                "the default idle_timeout of run_engine (the README fixes the signature)")
    with IpcDir() as d:
        _finish(_engine_process(impl, 0, d, idle_timeout=0.5),
                "with no front end and idle_timeout=0.5")
    with IpcDir() as d, _ClosedLingers() as closed:
        step("run_engine(0, ..., idle_timeout=0) in this process, nothing bound: the linger "
             "its DEALER closes with")
        impl.run_engine(0, d.path("in"), d.path("out"), 0.0)
    lingers = [ms for kind, ms in closed.calls if kind == zmq.DEALER]
    if lingers and lingers[0] != 0:
        raise Fail(f"run_engine closed its DEALER with a linger of {lingers[0]} ms: the README "
                   "fixes 0 for the DEALER (a READY that nobody will read is dropped at once, "
                   "and the engine's exit never waits for it)", expected=0, got=lingers[0])


class _ClosedLingers:
    """While active, records (socket type, its linger in ms) of every zmq socket this thread
    closes (close(linger=...), a LINGER set before, or Context.destroy(linger=...))."""

    def __enter__(self) -> "_ClosedLingers":
        self.calls, self.real, me = [], zmq.Socket.close, threading.current_thread()

        def close(sock, linger=None):
            if threading.current_thread() is me and not sock.closed:
                self.calls.append((sock.socket_type,
                                   sock.getsockopt(zmq.LINGER) if linger is None else linger))
            return self.real(sock, linger)
        zmq.Socket.close = close
        return self

    def __exit__(self, *exc) -> None:
        zmq.Socket.close = self.real


@test(input="run_engine(1, ...) in a process; the judge's ROUTER, no PULL bound yet; ADD o1, "
            "ADD o2, STOP; the PULL is bound once the engine's DEALER has disconnected",
      timeout=25)
def outputs_leave_after_stop(impl):
    ctx, d = zmq.Context(), IpcDir()
    router, pull = ctx.socket(zmq.ROUTER), ctx.socket(zmq.PULL)
    for s in (router, pull):
        s.setsockopt(zmq.LINGER, 0)
    monitor = router.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    router.bind(d.path("in"))
    proc = _engine_process(impl, 1, d)
    try:
        if not router.poll(int(START_S * 1000)):
            raise Fail(f"no READY from engine 1 within {START_S:g} s")
        router.recv_multipart()
        for frames in ([b"ADD", b"o1", b"ab"], [b"ADD", b"o2", b"cd"], [b"STOP"]):
            router.send_multipart([ID[1], *frames])
        # The engine answers both ADDs into its PUSH, whose peer does not exist yet, so the
        # outputs wait in the PUSH's queue; then it stops and closes. Only then the PULL binds.
        if not monitor.poll(int(STOP_S * 1000)):
            raise Fail(f"engine 1 had not closed its DEALER {STOP_S:g} s after STOP")
        pull.bind(d.path("out"))
        got = [pull.recv_multipart()[1].decode() for _ in range(2) if pull.poll(int(WAIT_S * 1000))]
        if got != ["o1", "o2"]:
            raise Fail("the outputs the engine had queued before STOP were lost when it closed "
                       "its PUSH: give the PUSH a linger of OUTPUT_LINGER_MS (a linger of 0 "
                       "drops whatever has not left yet)", expected=["o1", "o2"], got=got)
        _finish(proc, "after STOP and its outputs")
    finally:
        kill_if_alive(proc)
        router.disable_monitor()
        for s in (monitor, router, pull):
            s.close()
        ctx.term()
        d.close()


def _missing_ranks(error):
    """The ranks a wait_ready TimeoutError lists, e.g. 'engines [0, 1] did not ...' -> [0, 1]."""
    found = re.search(r"\[([\d,\s]*)\]", str(error))
    if found is None:
        raise Fail("wait_ready's TimeoutError must list the ranks that did not send READY",
                   expected="engines [0, 1] did not send READY within ...", got=str(error))
    return [int(r) for r in found.group(1).replace(",", " ").split()]


def _ready_one_by_one(fe, engines, order):
    """Let the engines say READY in `order`, each once a short wait_ready() that timed out has
    seen the one before (so the order is forced); return the last wait_ready()'s ranks."""
    for i, rank in enumerate(order):
        engines[rank].go.set()
        deadline = time.monotonic() + START_S
        while True:
            try:
                got = fe.wait_ready(0.2 * S)
            except TimeoutError as e:
                said, missing = str(e), _missing_ranks(e)
                if rank not in missing:
                    break
                if time.monotonic() > deadline:
                    raise Fail(f"engine {rank} said READY, and wait_ready() still named it "
                               f"missing {START_S:g} s later", got=said) from None
                continue
            if i < len(order) - 1:
                raise Fail(f"wait_ready() returned {got} while engines {list(order[i + 1:])} had "
                           "not said READY yet: a ROUTER silently drops a message for an "
                           "identity it has not heard from, so wait for every engine", got=got)
            return got
        forgot = [r for r in order[:i] if r in missing]
        if forgot:
            raise Fail(f"wait_ready() names engines {forgot} missing, whose READY an earlier call "
                       "(that timed out) saw: a later call counts the READYs an earlier one saw "
                       "(an engine says READY once)", got=said)


@test(input="FrontEnd(n_engines=3); engines say READY one at a time, 2, then 1, then 0, each "
            "once a wait_ready(0.2) that timed out saw the one before; then "
            "add_request('to-2', engine=2), 'to-0', 'to-1'; wait_ready(0.5) again", timeout=30)
def waits_for_every_engine(impl):
    with Bench(impl, 3, [None, None, None]) as b:
        step("wait_ready(0.2) while engines 2, 1, 0 say READY one at a time, then wait_ready()")
        ready = _ready_one_by_one(b.fe, b.engines, (2, 1, 0))
        step("add_request('to-2', engine=2), then 'to-0' and 'to-1', once wait_ready() returned")
        routed = [b.fe.add_request(f"to-{r}", b"prompt", engine=r) for r in (2, 0, 1)]
        for e in b.engines:
            e.wait_for(1)
            if e.requests != [f"to-{e.rank}"]:
                raise Fail(f"engine {e.rank} did not receive request 'to-{e.rank}' within "
                           f"{WAIT_S:g} s: a ROUTER silently drops a message for an identity it "
                           "has not heard from yet. wait_ready() must return only once every "
                           "engine has sent READY.", expected=[f"to-{e.rank}"], got=e.requests)
        check_equal(routed, [2, 0, 1], "add_request(..., engine=r) return values")
        check_equal(ready, [0, 1, 2], "wait_ready() (the ranks sorted, whatever the order of "
                    "their READYs: 2, 1, 0 here)", input="wait_ready() once engines 2, 1, 0 "
                    "said READY one at a time")
        step("wait_ready(0.5) again, every engine having said READY once, before")
        try:
            again = b.fe.wait_ready(0.5)
        except TimeoutError as e:
            raise Fail("a second wait_ready() must return at once: the engines that said READY "
                       "before still count (they will not say it again)",
                       got=f"TimeoutError: {e}") from None
        check_equal(again, [0, 1, 2], "a second wait_ready()")


@test(input="3 ready engines; add_request without engine x4, wait_ready() again, engine=2, "
            "then without x3; request ids r0 ... r7, r5 as 'r5-é' (UTF-8)", timeout=15)
def round_robin(impl):
    with Bench(impl, 3, [0, 0, 0]) as b:
        b.fe.wait_ready(10)
        ids = [f"r{i}" if i != 5 else "r5-é" for i in range(8)]
        routed = []
        for i, rid in enumerate(ids):
            if i == 4:
                b.fe.wait_ready(WAIT_S)
            routed.append(b.fe.add_request(rid, b"x", engine=2 if i == 4 else None))
        check_equal(routed, [0, 1, 2, 0, 2, 1, 2, 0],
                    "the ranks add_request returned (round robin 0, 1, 2, 0, ...; a request "
                    "with engine=2 goes to 2 and does not move the round robin; a second "
                    "wait_ready() does not restart it)")
        for e in b.engines:
            want = [rid for rid, r in zip(ids, routed) if r == e.rank]
            e.wait_for(len(want))
            check_equal(e.requests, want, f"the requests engine {e.rank} received, in order")


@test(input="3 ready engines, 9 requests, get_outputs(9, 5), then get_outputs(0, 0.3) and "
      "get_outputs(1, 0.3)",
      timeout=15, hang="get_outputs must give up after its timeout: poll, never a bare recv.")
def gathers_outputs(impl):
    with Bench(impl, 3, [0, 0, 0]) as b:
        b.fe.wait_ready(10)
        expected = []
        for i in range(9):
            prompt = f"prompt number {i}".encode()
            rank = b.fe.add_request(f"q{i}", prompt)
            expected.append((f"q{i}", rank, prompt[::-1]))
        step("get_outputs(9, 5) after 9 requests to 3 ready engines")
        outputs = b.fe.get_outputs(9, 5)
        check_equal(sorted(outputs), sorted(expected),
                    "the outputs (request_id, rank, output), sorted")
        step("get_outputs(0, 0.3)")
        try:
            none = b.fe.get_outputs(0, 0.3)
        except TimeoutError as e:
            raise Fail("get_outputs(0, ...) must return [] at once: check the count before "
                       "waiting for an output", got=f"TimeoutError: {e}") from None
        check_equal(none, [], "get_outputs(0, 0.3)")
        step("get_outputs(1, 0.3) with no output pending")
        try:
            extra = b.fe.get_outputs(1, 0.3)
        except TimeoutError:
            return
        raise Fail("get_outputs(1, 0.3) with no output pending must raise TimeoutError",
                   expected="TimeoutError", got=extra)


def _check_short_timeout(fe):
    """A third output, sent right after the two just taken: get_outputs(1, 0.9) returns it."""
    step("get_outputs(1, 0.9) with the third output there")
    try:
        got = fe.get_outputs(1, 0.9)
    except TimeoutError as e:
        raise Fail("get_outputs(1, 0.9) raised TimeoutError with an output already there: a "
                   "timeout under 1 s is a real wait (check the test that ends your loop)",
                   got=f"TimeoutError: {e}") from None
    check_equal(got, [("w3", 1, b"out3")], "get_outputs(1, 0.9) with one output there")


@test(input="FrontEnd(n_engines=300), no engine; the judge's PUSH sends outputs as engine 258 "
            "(b'\\x02\\x01') and engine 1, then one more; get_outputs(2, ...), then "
            "get_outputs(1, 0.9)", timeout=15)
def outputs_name_a_wide_rank(impl):
    with IpcDir() as d:
        fe = impl.FrontEnd(d.path("in"), d.path("out"), 300)
        ctx = zmq.Context()
        push = ctx.socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 0)
        try:
            push.connect(d.path("out"))
            push.send_multipart([b"\x02\x01", b"w1", b"out1"])
            push.send_multipart([ID[1], b"w2", b"out2"])
            push.send_multipart([ID[1], b"w3", b"out3"])  # there by the time w2 is taken
            step(f"get_outputs(2, {WAIT_S:g}) with outputs of engines 258 and 1 sent")
            try:
                got = fe.get_outputs(2, WAIT_S)
            except TimeoutError as e:
                raise Fail(f"the judge's 2 outputs did not come out of get_outputs(2, {WAIT_S:g})",
                           got=f"TimeoutError: {e}") from None
            check_equal(got, [("w1", 258, b"out1"), ("w2", 1, b"out2")],
                        "get_outputs: the rank of identity b'\\x02\\x01' is 258 (both bytes, "
                        "little endian: rank_of)")
            _check_short_timeout(fe)
        finally:
            push.close()
            ctx.term()
            fe.close()


@test(input="FrontEnd(n_engines=3), only engines 0 and 1 start, each sends READY twice; "
            "wait_ready(1.0)", timeout=15,
      hang="wait_ready must give up after its timeout: poll, never a bare recv.")
def wait_ready_timeout(impl):
    with Bench(impl, 3, [0, 0], readies=2) as b:
        try:
            got = b.fe.wait_ready(1.0)
        except TimeoutError as e:
            if "[2]" not in str(e):
                raise Fail("the TimeoutError must list the ranks that did not send READY",
                           expected="... [2] ...", got=str(e))
            return
        raise Fail("wait_ready(1.0) must raise TimeoutError when engine 2 never says READY "
                   "(engines 0 and 1 said it twice: count distinct ranks, not messages)",
                   expected="TimeoutError", got=got)


def _trickle_outputs(d, times, stop):
    """The judge's PUSH sends an output for rank 0 at each of `times` (s from now)."""
    ctx = zmq.Context.instance()
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.connect(d.path("out"))
    start = time.monotonic()
    try:
        for i, at in enumerate(times):
            if stop.wait(max(0.0, start + at - time.monotonic())):
                return
            push.send_multipart([ID[0], f"t{i}".encode(), b"out"])
    finally:
        push.close()


@test(input="wait_ready(1.2) with engines 0 and 1 saying READY 0.3 s and 0.6 s in, engine 2 "
            "never; get_outputs(5, 1.2) with outputs coming 0.3, 0.6, 0.9, 3.0 and 3.3 s in "
            "(times stretched on a busy machine); first each with no engine, on a clock that "
            "stands still, timeout 2, 0.0005 and 0",
      timeout=25)
def waits_count_in_total(impl):
    with Bench(impl, 3, []) as b:  # no engine: each first wait is the whole timeout
        step("wait_ready(timeout) with no engine, on a clock that stands still")
        check_polls_time_left(b.fe.wait_ready, "wait_ready(timeout) with no engine", START_S,
                              FROZEN_TIMEOUTS)
        step("get_outputs(1, timeout) with no output, on a clock that stands still")
        check_polls_time_left(lambda t: b.fe.get_outputs(1, t), "get_outputs(1, timeout)", START_S,
                              FROZEN_TIMEOUTS)
    asked = 1.2 * S
    with Bench(impl, 3, [0.3 * S, 0.6 * S]) as b, PollLog() as polls:
        step(f"wait_ready({asked:.2g}) with engines 0 and 1 saying READY 0.3 s and 0.6 s in")
        try:
            b.fe.wait_ready(asked)
        except TimeoutError:
            pass
        else:
            raise Fail("wait_ready must raise TimeoutError when engine 2 never says READY")
        polls.fail_if_past(asked, f"wait_ready({asked:.2g})", "message")
    with Bench(impl, 1, [0]) as b:
        b.fe.wait_ready(START_S)
        step(f"get_outputs(5, {asked:.2g}) with outputs coming 0.3, 0.6, 0.9, 3.0 and 3.3 s in")
        stop = threading.Event()
        times = [t * S for t in TRICKLE_AT]
        pusher = threading.Thread(target=_trickle_outputs, args=(b.d, times, stop))
        with PollLog() as polls:
            pusher.start()
            try:
                got = b.fe.get_outputs(len(TRICKLE_AT), asked)
            except TimeoutError:
                got = None
            finally:
                stop.set()
                pusher.join()
        if got is not None:
            took = time.monotonic() - polls.started
            raise Fail(f"get_outputs(5, {asked:.2g}) returned {took:.1f} s after the call, with "
                       f"outputs that came after its deadline: `timeout` is for all n outputs "
                       f"together, and every wait must be bounded by it",
                       got=[o[0] for o in got])
        polls.fail_if_past(asked, f"get_outputs(5, {asked:.2g})", "output")


@test(input="your engine with idle_timeout=1.0, an ADD every 0.2 s for 1.6 s, then silence "
            "(times stretched on a busy machine); first your run_engine with no front end, on "
            "a clock that stands still, idle_timeout 2, 0.0005 and 0",
      timeout=30)
def engine_idle_is_per_message(impl):
    with IpcDir() as d:  # nothing bound: the engine's first wait is its whole idle_timeout
        step("run_engine(1, ..., idle_timeout) in this process, on a clock that stands still")
        check_polls_time_left(lambda t: impl.run_engine(1, d.path("in"), d.path("out"), t),
                              "run_engine(..., idle_timeout) with no front end", START_S,
                              FROZEN_TIMEOUTS)
    step(f"run_engine(1, ..., idle_timeout={S:.2g}) in a process, an ADD every {0.2 * S:.2g} s")
    with _judge_front(impl, 1, idle_timeout=1.0 * S) as (router, pull, proc):
        if not router.poll(int(START_S * 1000)):
            raise Fail(f"no READY from engine 1 within {START_S:g} s")
        router.recv_multipart()
        answered = []
        for i in range(8):
            router.send_multipart([ID[1], b"ADD", f"a{i}".encode(), b"xy"])
            if not pull.poll(int(WAIT_S * 1000)):
                break
            answered.append(pull.recv_multipart()[1].decode())
            time.sleep(0.2 * S)
        if len(answered) < 8:
            raise Fail(f"the engine stopped answering while an ADD came every {0.2 * S:.2g} s: "
                       f"idle_timeout={S:.2g} counts from the last message, not from the start",
                       expected=[f"a{i}" for i in range(8)], got=answered)
        _finish(proc, "1 s after the last ADD (idle_timeout=1.0)")


@test(input="your FrontEnd and 2 of your engines as processes; 20 requests; shutdown()",
      timeout=40)
def end_to_end(impl):
    with IpcDir() as d:
        fe = impl.FrontEnd(d.path("in"), d.path("out"), 2)
        procs = [_engine_process(impl, r, d) for r in range(2)]
        try:
            check_equal(fe.wait_ready(START_S), [0, 1], "wait_ready()")
            expected = []
            for i in range(20):
                prompt = os.urandom(1 + i)
                expected.append((f"e{i}", fe.add_request(f"e{i}", prompt), prompt[::-1]))
            check_equal(sorted(fe.get_outputs(20, START_S)), sorted(expected),
                        "the outputs (request_id, rank, output), sorted")
            fe.shutdown()
            for r, proc in enumerate(procs):
                _finish(proc, f"after shutdown(), engine {r}")
        finally:
            for proc in procs:
                kill_if_alive(proc)
            fe.close()
