"""The judge's tests for exercise 401. Each receives the learner's module as `impl`.

The judge's engines are real DEALER sockets with the DP rank as identity: threads that only
record what they receive and report "finished" when a test says so (so every load is known
exactly), and, in the last test, processes that generate tokens on their own.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import threading
import time

import msgspec
import zmq

from minivllm.judge.api import EngineBench, Fail, check_equal, kill_if_alive, scaled, step, test
from minivllm.judge.polls import PollLog, check_polls_time_left, first_poll
from minivllm.judge.procfs import fd_count
from minivllm.utils.zmq import IpcDir

WAIT_S = scaled(2.0)  # a message between threads on one host not delivered in this long was dropped
QUIET_S = 0.3  # how long a test listens where nothing should arrive
TAKE_ROUNDS = 3  # rounds to see one poll take two outputs that are both there
TRICKLE_ROUNDS = 3  # rounds to see READYs trickle in during one wait_ready


def ident(rank: int) -> bytes:
    return rank.to_bytes(2, "little")


class JudgeEngine(threading.Thread):
    """A passive engine: says READY, records [kind, payload] it receives, and sends
    EngineOutputs when the test calls finish()."""

    def __init__(self, ctx, address, rank, delay=0.0):
        super().__init__(daemon=True)
        self.ctx, self.address, self.rank, self.delay = ctx, address, rank, delay
        self.received: list[tuple[str, object]] = []
        self.commands: queue.Queue = queue.Queue()
        self.stop = threading.Event()
        self.ready_at: float | None = None  # time.monotonic() when READY was sent
        self.sent = 0  # messages sent after READY
        self.start()

    def run(self):
        if self.stop.wait(self.delay):
            return
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, ident(self.rank))
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.address)
        sock.send(b"READY")
        self.ready_at = time.monotonic()
        try:
            while not self.stop.is_set():
                while not self.commands.empty():
                    sock.send_multipart(self.commands.get())
                    self.sent += 1
                if sock.poll(10):
                    kind, *rest = sock.recv_multipart()
                    payload = msgspec.msgpack.decode(rest[0]) if rest else None
                    self.received.append((kind.decode(), payload))
        finally:
            sock.close()

    def finish(self, ids, tokens=None):
        out = {"engine_index": self.rank, "new_tokens": tokens or {},
               "finished_requests": list(ids)}
        self.commands.put([b"OUTPUTS", msgspec.msgpack.encode(out)])

    def wait_for(self, n, timeout=WAIT_S):
        deadline = time.monotonic() + timeout
        while len(self.received) < n and time.monotonic() < deadline:
            time.sleep(0.005)
        return self.received


class Bench(EngineBench):
    """The learner's client and n passive judge engines; closes everything afterwards."""

    def __init__(self, impl, n, delays=None, ready=True):
        super().__init__()
        self.address = self.d.path("in")
        self.client = self.learner = impl.DPLBClient(self.address, n)
        self.engines = [JudgeEngine(self.ctx, self.address, r, (delays or [0] * n)[r])
                        for r in range(len(delays or [0] * n))]
        if ready:
            check_equal(self.client.wait_ready(10), list(range(n)), "wait_ready()")

    def adds(self) -> list[list[str]]:
        """Per engine, the ids of the ADDs it received so far."""
        return [[p["request_id"] for k, p in e.received if k == "ADD"] for e in self.engines]

    def settle(self, engine_counts):
        for e, n in zip(self.engines, engine_counts):
            e.wait_for(n)

    def finished(self, rank, ids):
        """Engine `rank` reports ids finished; the client must take that output."""
        self.engines[rank].finish(ids)
        outs = self.client.poll_outputs(WAIT_S)
        got = [r for o in outs for r in o.finished_requests]
        if got != list(ids):
            raise Fail(f"poll_outputs({WAIT_S:g}) after engine {rank} reported {ids} finished",
                       expected=ids, got=got)


@test(input="3 engines, identities b'\\x00\\x00', b'\\x01\\x00', b'\\x02\\x00', connecting 0.2, "
            "0.4, 0.6 s late; then 4 engines of which 0, 2, 3 say READY 0.3, 0.6, 0.9 s late and "
            "wait_ready(1) (times stretched on a busy machine); then shutdown() with engine 1 "
            "never connected", timeout=20)
def ready_and_timeout(impl):
    step("engine_identity(258)")
    check_equal(impl.engine_identity(258), b"\x02\x01", "engine_identity(258) (2 bytes, little "
                                                      "endian, as vllm/v1/engine/core.py:1191)")
    _check_identity_bounds(impl)
    step("a client over 3 engines connecting 0.2, 0.4, 0.6 s late, wait_ready, shutdown")
    with Bench(impl, 3, [0.2, 0.4, 0.6]):
        pass
    never, s = 3600.0, scaled(1.0)  # engine 1 never connects (the bench stops it)
    for _ in range(TRICKLE_ROUNDS):
        step(f"wait_ready({s:g}) over 4 engines, engine 1 never connects, the others' READYs "
             "trickle in")
        with Bench(impl, 4, [0.3 * s, never, 0.6 * s, 0.9 * s], ready=False) as b:
            if _check_total_timeout(b, timeout=s):
                step("wait_ready(timeout) with engine 1 missing, on a clock that stands still")
                check_polls_time_left(b.client.wait_ready, "wait_ready(timeout) with engine 1 "
                                      "missing", WAIT_S)
                _check_waits_to_deadline(b.client.wait_ready)
                step("shutdown() with engine 1 missing")
                _check_shutdown_skips_a_missing_engine(b)
                return
    raise Fail(f"in {TRICKLE_ROUNDS} rounds the judge called wait_ready too late to see the "
               "READYs trickle in (the machine is too busy to tell): run the judge again")


def _check_waits_to_deadline(wait_ready) -> None:
    """wait_ready(0.5) on a clock that stands still, engine 1 missing: the whole 0.5 s is left,
    so its first poll waits for it; raising without that wait gives up before the deadline."""
    polled, ms = first_poll(wait_ready, 0.5, WAIT_S)
    if not polled or ms is None or ms < 499:
        raise Fail("wait_ready(0.5) with engine 1 missing, on a clock that stood still (the whole "
                   "0.5 s left), " + (f"polled for {ms} ms" if polled else "raised without "
                   "waiting") + ": it waits until every engine sent READY or its deadline "
                   "passes, polling with the time left, not giving up before the deadline",
                   expected="poll(500)", got=f"poll({ms})" if polled else "no poll")


def _check_identity_bounds(impl):
    step("engine_identity(65535), rank_of(b'\\xff\\xff'), rank_of(b'\\x02\\x01')")
    check_equal((impl.engine_identity(65535), impl.rank_of(b"\xff\xff"), impl.rank_of(b"\x02\x01")),
                (b"\xff\xff", 65535, 258), "(engine_identity(65535), rank_of(b'\\xff\\xff'), "
                                            "rank_of(b'\\x02\\x01'))")
    for call, arg in [("engine_identity", 65536), ("engine_identity", -1), ("rank_of", b"\x01"),
                      ("rank_of", b"\x01\x00\x00"), ("rank_of", b"")]:
        step(f"{call}({arg!r})")
        try:
            got = getattr(impl, call)(arg)
        except ValueError:
            continue
        except Exception as e:
            got = f"{type(e).__name__}: {e}"
        raise Fail(f"{call}({arg!r}) must raise ValueError (a rank outside [0, 65535], an "
                   "identity that is not 2 bytes)", got=got)


def _check_total_timeout(b, timeout) -> bool:
    """Whether the round told: False when the READYs had mostly come before the call."""
    start = time.monotonic()
    try:
        got = b.client.wait_ready(timeout)
    except TimeoutError as e:
        end = time.monotonic()
        if end < start + timeout - 0.05:  # a correct wait raises at its deadline, not before
            raise Fail(f"wait_ready({timeout:g}) raised {end - start:.2f} s after it was called, "
                       "before its deadline, while READYs still trickled in: it waits until every "
                       "engine sent READY or its deadline passes, not giving up before the "
                       "deadline", expected=f"TimeoutError at {timeout:g} s",
                       got=f"TimeoutError at {end - start:.2f} s: {e}")
        if "[1]" not in str(e):
            raise Fail("the TimeoutError must list the ranks that did not send READY (engine 1 "
                       "of 0-3; the others did)", expected="... [1] ...", got=str(e))
    else:
        raise Fail(f"wait_ready({timeout:g}) must raise TimeoutError when engine 1 never says "
                   "READY", got=got)
    last = max(b.engines[r].ready_at for r in (0, 2, 3))
    if last - start < timeout / 2:  # the judge stalled: the trickle was over before the call
        return False
    if end >= last + timeout:  # a correct wait ended at start + timeout, long before
        raise Fail(f"wait_ready({timeout:g}) raised {end - start:.2f} s after it was called, "
                   f"{timeout:g} s after the last READY (sent {last - start:.2f} s in): the "
                   "timeout restarts on every message; it must be one deadline for the whole "
                   "call (READYs came in a trickle)")
    return True


def _check_shutdown_skips_a_missing_engine(b):
    try:
        b.client.shutdown()
    except zmq.ZMQError as e:
        raise Fail(f"shutdown() raised ZMQError ({e}) because engine 1 never connected: an "
                   "engine that is gone must be skipped (ROUTER_MANDATORY raises for it), and "
                   "the others still get STOP") from None
    others = [b.engines[r] for r in (0, 2, 3)]
    for e in others:
        e.wait_for(1)
    check_equal([e.received for e in others], [[("STOP", None)]] * 3,
                "what engines 0, 2, 3 received from shutdown() (engine 1, between them, never "
                "connected: it is skipped and the engines after it still get STOP)")


@test(input="2 engines, of which only engine 0 is up: wait_ready(0.3) times out; then engine 1 "
            "starts, says READY and sends one EngineOutputs; poll_outputs until it comes; then "
            "wait_ready(0.3)")
def late_ready_is_counted(impl):
    with Bench(impl, 2, [0], ready=False) as b:
        try:
            got = b.client.wait_ready(0.3)
        except TimeoutError:
            pass
        else:
            raise Fail("wait_ready(0.3) must raise TimeoutError while engine 1 is not up", got=got)
        late = JudgeEngine(b.ctx, b.address, 1)
        b.engines.append(late)
        late.finish([])  # sent after its READY
        step(f"poll_outputs({WAIT_S:g}): engine 1's READY, then its output, come")
        try:
            with PollLog() as log:
                outs = b.client.poll_outputs(WAIT_S)
        except Exception as e:
            raise Fail(f"poll_outputs raised {type(e).__name__}: {e}, where engine 1's READY came "
                       "after wait_ready had timed out (an engine that started late): a READY is "
                       "not an output; count it, as wait_ready would, and go on") from None
        check_equal([o.engine_index for o in outs], [1], "the engine_index of each output "
                    "poll_outputs returned (engine 1 sent its READY, then one output: a READY "
                    "is no output, so count it and wait on, to the same deadline, for the output)")
        polls = [ms for _, ms in log.calls]
        if polls and not log.found[-1] and polls[-1] != 0:  # the poll that ended the call
            raise Fail(f"poll_outputs({WAIT_S:g}) took engine 1's output, then waited again for "
                       f"more (its last poll, which found nothing: poll({polls[-1]})): the "
                       "README has it take every output already there without waiting again "
                       "(poll(0)), so a caller is not held up once an output came",
                       expected="a last poll(0)", got=f"its polls: {polls}")
        step(f"wait_ready({scaled(QUIET_S):g}) after poll_outputs took engine 1's late READY")
        try:
            got = b.client.wait_ready(scaled(QUIET_S))
        except TimeoutError as e:
            raise Fail("wait_ready after poll_outputs took engine 1's late READY raised "
                       f"TimeoutError ({e}): a READY counts wherever it is taken, and a later "
                       "wait_ready counts the READYs that earlier calls (and poll_outputs) saw, "
                       "even a call that timed out") from None
        check_equal(got, [0, 1], "wait_ready once both engines have said READY")


@test(input="4 idle engines; add_request r0..r7 (max_tokens 8)")
def spreads_when_idle(impl):
    with Bench(impl, 4) as b:
        ranks = [b.client.add_request(f"r{i}", 8) for i in range(8)]
        check_equal(ranks, [0, 1, 2, 3, 0, 1, 2, 3],
                    "the engines chosen for 8 requests on 4 idle engines (the fewest in flight; "
                    "ties go to the first from a start index that moves on by one per request)")
        b.settle([2, 2, 2, 2])
        first = b.engines[0].received[0]
        check_equal(first, ("ADD", {"request_id": "r0", "max_tokens": 8}),
                    "the first message engine 0 received (kind, decoded payload: AddRequest "
                    "as a msgpack map)")
        check_equal(b.adds(), [["r0", "r4"], ["r1", "r5"], ["r2", "r6"], ["r3", "r7"]],
                    "the ADDs each engine received (frames [identity, b'ADD', msgpack "
                    "AddRequest])")
        check_equal(b.client.load(), [2, 2, 2, 2], "load() after 8 requests")


@test(input="3 engines hold 2 requests each; engine 1 finishes both; then r6, r7, r8; engines 1 "
            "and 2 finish r6, r2, r8; then r9; engine 2 reports r8 finished again")
def least_loaded_after_finish(impl):
    with Bench(impl, 3) as b:
        for i in range(6):
            b.client.add_request(f"r{i}", 8)
        b.settle([2, 2, 2])
        b.finished(1, ["r1", "r4"])
        check_equal(b.client.load(), [2, 0, 2],
                    "load() after engine 1 reported r1 and r4 finished")
        ranks = [b.client.add_request(f"r{i}", 8) for i in range(6, 9)]
        check_equal(ranks, [1, 1, 2],
                    "the engines chosen for r6, r7, r8 with loads [2, 0, 2] (r6 and r7 go to "
                    "the least loaded; r8 meets a tie [2, 2, 2] scanned from start index 2)")
        check_equal(b.client.load(), [2, 2, 3], "load() after r6, r7, r8")
        check_equal(b.client.reqs_in_flight,
                    {"r0": 0, "r2": 2, "r3": 0, "r5": 2, "r6": 1, "r7": 1, "r8": 2},
                    "reqs_in_flight (finished requests leave it)")
        _check_scan_goes_up(b)


def _check_scan_goes_up(b):
    """Loads [2, 1, 1] from start index 0: the scan 0, 1, 2 takes engine 1 (a scan that goes
    down, 0, 2, 1, takes engine 2). Then an id reported finished a second time is skipped."""
    b.finished(1, ["r6"])
    b.finished(2, ["r2", "r8"])
    check_equal(b.client.add_request("r9", 8), 1, "the engine chosen for r9 with loads [2, 1, 1] "
                "and start index 0: the scan goes up from the start index (0, 1, 2, mod n) and "
                "takes the first least loaded")
    try:
        b.finished(2, ["r8"])
    except KeyError as e:
        raise Fail("poll_outputs raised KeyError when engine 2 reported r8 finished a second "
                   "time: an id no longer in flight (an abort that met its finish) is skipped",
                   got=repr(e)) from None
    check_equal(b.client.load(), [2, 2, 1], "load() after engine 2 reported r8 finished twice "
                "(the second report of an id no longer in flight changes nothing)")


@test(input="3 idle engines: add_request('a', engine=1), then 'b', 'c0', 'c1'; then engine=3, "
            "engine=-1 and the id 'a' again (all refused); then 'd' and 'e'; then 'f' with "
            "engine=0; then poll_outputs(0.3) with no output coming",
      hang="poll_outputs(0.3) with nothing to take did not return: its timeout must bound the "
           "wait (a poll with no timeout, or None, waits forever)")
def explicit_engine_and_bad_input(impl):
    with Bench(impl, 3) as b:
        got = [b.client.add_request("a", 4, engine=1), b.client.add_request("b", 4)]
        check_equal(got, [1, 0], "add_request('a', engine=1), then 'b' without engine (a named "
                                 "engine does not move the start index: 'b' scans from 0)")
        check_equal(b.client.load(), [1, 1, 0], "load() (a request sent to a named engine "
                                                "counts on that engine)")
        got = [b.client.add_request("c0", 4), b.client.add_request("c1", 4)]
        check_equal(got, [2, 2], "the engines chosen for 'c0' (loads [1, 1, 0], scanned from "
                    "start index 1) and 'c1' (a tie [1, 1, 1] scanned from start index 2): the "
                    "start index moves on by one from where the last scan started (0, 1, 2, ...), "
                    "not to the engine after the one chosen")
        for args, kw, why in [(("c", 4), {"engine": 3}, "engine=3 of 3 engines"),
                              (("c", 4), {"engine": -1}, "engine=-1"),
                              (("a", 4), {}, "the id 'a', already in flight")]:
            try:
                got = b.client.add_request(*args, **kw)
            except ValueError:
                continue
            except Exception as e:
                raise Fail(f"add_request{args} with {kw or 'no engine'} ({why}) raised "
                           f"{type(e).__name__}: {e}; the README requires ValueError, raised "
                           "before anything is sent or counted") from None
            raise Fail(f"add_request must raise ValueError for {why}", got=got)
        check_equal(b.client.load(), [1, 1, 2], "load() after the refused requests")
        time.sleep(QUIET_S)
        check_equal(b.adds(), [["b"], ["a"], ["c0", "c1"]], "the ADDs each engine received (a "
                                                           "refused request sends nothing)")
        got = [b.client.add_request("d", 4), b.client.add_request("e", 4)]
        check_equal(got, [0, 1], "the engines chosen for 'd' (loads [1, 1, 2], start index 0 "
                                 "before the refusals) and 'e' (loads [2, 1, 2]): a refused "
                                 "request must not move the start index")
        try:
            got = b.client.add_request("f", 4, engine=0)
        except ValueError as e:
            raise Fail(f"add_request('f', engine=0) raised ValueError: {e}; engine 0 is the "
                       "first engine, a valid name (look at the lower bound of your range "
                       "check)") from None
        check_equal(got, 0, "add_request('f', engine=0)")
        step("poll_outputs(timeout) on a clock that stands still, nothing sent")
        check_polls_time_left(b.client.poll_outputs, "poll_outputs(timeout)", WAIT_S)
        step(f"poll_outputs({QUIET_S:g}) when no engine has sent anything")
        check_equal(b.client.poll_outputs(QUIET_S), [], f"poll_outputs({QUIET_S:g}) when no "
                                                        "engine has sent anything")


@test(input="r0..r5 on 3 engines; abort(['r1', 'r5', 'nope', 'r0', 'r4']) after engine 0 "
            "finished r0; engines 1 and 2 send new tokens; then they report the aborted ones "
            "finished")
def abort_follows_request(impl):
    with Bench(impl, 3) as b:
        for i in range(6):
            b.client.add_request(f"r{i}", 8)
        b.settle([2, 2, 2])
        b.finished(0, ["r0"])
        b.client.abort(["r1", "r5", "nope", "r0", "r4"])
        b.settle([2, 3, 3])
        time.sleep(QUIET_S)
        aborts = [[sorted(p) for k, p in e.received if k == "ABORT"] for e in b.engines]
        check_equal(aborts, [[], [["r1", "r4"]], [["r5"]]],
                    "the ABORTs each engine received: one per engine, with all of its ids; each "
                    "id goes only to the engine that holds it; ids not in flight (finished r0, "
                    "unknown 'nope') go nowhere")
        check_equal(b.client.load(), [1, 2, 2],
                    "load() after abort() (an aborted request stays in flight until its engine "
                    "reports it finished)")
        _check_takes_every_output(b)
        check_equal(b.client.load(), [1, 0, 1], "load() after the aborted requests finished")
        check_equal(sorted(b.client.reqs_in_flight), ["r2", "r3"], "reqs_in_flight")


def _check_takes_every_output(b):
    """Engines 1 and 2 both report; once both outputs are there, one poll_outputs takes both.
    The judge cannot see the client's queue: a round in which one poll took one output is run
    again, listening longer before the poll, with outputs of new tokens only."""
    for k in range(TAKE_ROUNDS):
        sent = (b.engines[1].sent, b.engines[2].sent)
        b.engines[1].finish([], {"r1": [k]})
        b.engines[2].finish([], {"r5": [k]})
        outs, took = _poll_once_both_sent(b, sent, scaled(QUIET_S) * 3 ** k)
        if len(outs) == 2:
            break
        b.client.poll_outputs(WAIT_S)  # the other one, late or left behind
    else:
        raise Fail(f"one poll_outputs({WAIT_S:g}) took one of two outputs in each of "
                   f"{TAKE_ROUNDS} rounds, with both sent well before it (engines 1 and 2): wait "
                   "for the first, then take every one already there", got=len(outs))
    if took >= 0.9 * WAIT_S:  # only a second full wait takes this long
        raise Fail(f"poll_outputs({WAIT_S:g}) with both outputs already there returned only after "
                   f"{took:.2f} s: it waited again after taking them. Wait once, for the first "
                   "message, then take every one already there without waiting again",
                   expected=f"well under {WAIT_S:g} s", got=f"{took:.2f} s")
    b.engines[1].finish(["r1", "r4"])
    b.engines[2].finish(["r5"])
    got = []
    while len(got) < 3 and (outs := b.client.poll_outputs(WAIT_S)):
        got += [r for o in outs for r in o.finished_requests]
    check_equal(sorted(got), ["r1", "r4", "r5"], "the finished ids poll_outputs took after "
                "engine 1 finished r1 and r4 and engine 2 finished r5")


def _poll_once_both_sent(b, sent, quiet):
    """One poll_outputs once engines 1 and 2 have each sent one more message than `sent` and
    `quiet` s passed: (outputs, seconds)."""
    deadline = time.monotonic() + WAIT_S
    while (b.engines[1].sent <= sent[0] or b.engines[2].sent <= sent[1]) and \
            time.monotonic() < deadline:
        time.sleep(0.005)
    time.sleep(quiet)  # both are sent; give them the time to arrive
    start = time.monotonic()
    with PollLog() as log:
        outs = b.client.poll_outputs(WAIT_S)
    took, polls = time.monotonic() - start, [ms for _, ms in log.calls]
    again = [ms for ms, found in list(zip(polls, log.found))[1:] if not found and ms != 0]
    if outs and again:  # a poll after the first that found nothing, having waited for it
        raise Fail(f"poll_outputs({WAIT_S:g}) took its outputs, then waited again for more "
                   f"(poll({again[0]})): the README has it take every output already there "
                   "without waiting again (poll(0))", got=f"its polls: {polls}")
    return outs, took


@test(input="two clients side by side, 2 engines each: r0 to the first; the first closed; then "
            "s0 to the second")
def two_clients(impl):
    with Bench(impl, 2) as a, Bench(impl, 2) as b:
        a.client.add_request("r0", 4)
        check_equal((b.client.reqs_in_flight, b.client.load()), ({}, [0, 0]),
                    "the second client's (reqs_in_flight, load()) after r0 went to the first: "
                    "each client keeps its own")
        closer = threading.Thread(target=a.client.close, daemon=True)
        closer.start()
        closer.join(WAIT_S)
        if closer.is_alive():  # its term() waits for b's socket: leave both to the judge
            a.learner = b.learner = None
            raise Fail("the first client's close() did not return while a second client was "
                       "open: each client needs its own zmq.Context (Context.instance() is "
                       "shared, and its term() waits for every socket of the process)")
        a.learner = None  # closed once; end_to_end checks a second close()
        check_equal(b.client.add_request("s0", 4), 0, "the second client's add_request('s0') "
                    "after the first client closed")
        b.settle([1, 0])
        check_equal(b.adds(), [["s0"], []], "the ADDs the second client's engines received")


# --- real engine processes ---------------------------------------------------------------------
def _engine_process(address, rank, interval, report):
    """An engine that emits one token per request every `interval` s; finishes at max_tokens;
    answers an ABORT by finishing the ids it holds. Reports what it saw on `report` at exit."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, ident(rank))
    sock.setsockopt(zmq.LINGER, 1000)
    sock.connect(address)
    sock.send(b"READY")
    running: dict[str, list[int]] = {}
    stats = {"added": [], "aborted": [], "misrouted_aborts": [], "max_running": 0}
    max_tokens: dict[str, int] = {}
    try:
        while True:
            finished: list[str] = []
            if sock.poll(int(interval * 1000)):
                kind, *rest = sock.recv_multipart()
                if kind == b"STOP":
                    return
                payload = msgspec.msgpack.decode(rest[0])
                if kind == b"ADD":
                    running[payload["request_id"]] = []
                    max_tokens[payload["request_id"]] = payload["max_tokens"]
                    stats["added"].append(payload["request_id"])
                elif kind == b"ABORT":
                    for rid in payload:
                        if rid in running:
                            del running[rid]
                            finished.append(rid)
                            stats["aborted"].append(rid)
                        elif rid not in stats["added"]:  # not merely finished already
                            stats["misrouted_aborts"].append(rid)
            stats["max_running"] = max(stats["max_running"], len(running))
            new = {}
            for rid, toks in list(running.items()):
                toks.append(len(toks))
                new[rid] = [toks[-1]]
                if len(toks) >= max_tokens[rid]:
                    del running[rid]
                    finished.append(rid)
            if new or finished:
                sock.send_multipart([b"OUTPUTS", msgspec.msgpack.encode(
                    {"engine_index": rank, "new_tokens": new, "finished_requests": finished})])
    finally:
        report.send(stats)
        sock.close()
        ctx.term()


@test(input="3 engine processes (engine 0 four times slower); 60 requests of 3..12 tokens added "
            "while outputs stream; every 5th aborts an earlier one; run until all finish; "
            "shutdown()", timeout=60)
def end_to_end(impl):
    with IpcDir() as d:
        address = d.path("in")
        mpc = mp.get_context("fork")  # forked before this process makes any ZMQ context
        pipes = [mpc.Pipe(duplex=False) for _ in range(3)]
        procs = [mpc.Process(target=_engine_process, args=(address, r, 0.02 if r == 0 else 0.005,
                                                           pipes[r][1]), daemon=True)
                 for r in range(3)]
        for p in procs:
            p.start()
        fds = fd_count()
        client = impl.DPLBClient(address, 3)
        try:
            _drive(client, pipes)
            _check_close(client, address, fds)
        finally:
            for p in procs:
                p.join(1)
            kill_if_alive(*procs)
            try:
                client.close()
            except Exception:  # _check_close reported it already, or a failure comes first
                pass


def _check_close(client, address, fds_before):
    client.close()
    path = address.removeprefix("ipc://")
    if os.path.exists(path):
        raise Fail(f"close() left the ipc socket file {path}: close() must unlink it")
    if fd_count() != fds_before:  # term() returns once the context's threads and fds are gone
        raise Fail(f"close() left {fd_count() - fds_before} file descriptors open that the "
                   "client opened: close() must close the socket and terminate its context "
                   "(its I/O threads hold them)", expected=fds_before, got=fd_count())
    try:
        client.close()
    except Exception as e:
        raise Fail(f"a second close() raised {type(e).__name__}: {e}; it must do nothing") \
            from None


def _drive(client, pipes):
    check_equal(client.wait_ready(10), [0, 1, 2], "wait_ready()")
    tokens: dict[str, list[int]] = {}
    finished: set[str] = set()
    routed: dict[str, int] = {}
    aborted: set[str] = set()
    for i in range(60):
        rid = f"q{i}"
        loads = client.load()
        routed[rid] = client.add_request(rid, 3 + i % 10)
        if loads[routed[rid]] != min(loads):
            raise Fail(f"{rid} went to engine {routed[rid]}, which had {loads[routed[rid]]} in "
                       "flight, not to one of the least loaded", input=f"load() before: {loads}")
        if i % 5 == 4:
            client.abort([f"q{i - 2}"])
            aborted.add(f"q{i - 2}")
        for out in client.poll_outputs(0.002):
            for r, t in out.new_tokens.items():
                tokens.setdefault(r, []).extend(t)
            finished.update(out.finished_requests)
    deadline = time.monotonic() + 20
    while len(finished) < 60 and time.monotonic() < deadline:
        for out in client.poll_outputs(0.1):
            for r, t in out.new_tokens.items():
                tokens.setdefault(r, []).extend(t)
            finished.update(out.finished_requests)
    check_equal(len(finished), 60, "requests reported finished (each exactly once by its engine)")
    check_equal((client.reqs_in_flight, client.load()), ({}, [0, 0, 0]),
                "(reqs_in_flight, load()) once every request finished")
    for i in range(60):
        rid = f"q{i}"
        want = list(range(3 + i % 10))
        got = tokens.get(rid, [])
        if got != want and not (rid in aborted and got == want[:len(got)]):
            raise Fail(f"the tokens of {rid}", expected=want, got=got)
    client.shutdown()
    stats = []
    for r, (recv_end, _) in enumerate(pipes):
        if not recv_end.poll(10):
            raise Fail(f"engine {r} did not stop after shutdown() (send [identity, b'STOP'])")
        stats.append(recv_end.recv())
    for r, s in enumerate(stats):
        check_equal(sorted(s["added"]), sorted(k for k, v in routed.items() if v == r),
                    f"the requests engine {r} received (exactly those for which add_request "
                    f"returned {r})")
        check_equal(s["misrouted_aborts"], [], f"aborts engine {r} received for requests it "
                                               "never had")
