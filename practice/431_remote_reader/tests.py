"""The judge's tests for exercise 431. Each receives the learner's module as `impl`.

The writer is the judge's own XPUB on tcp://127.0.0.1 (in this process, or in a child process
that the test kills with SIGKILL); the readers are the learner's. Deadlines are checked against
the timeout asked for, and where a race would decide (messages that trickle in), the judge
paces the writer itself and re-runs a round whose pacing it could not keep.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import threading
import time

import zmq

from minivllm.judge.api import Fail, check_equal, scaled, step, test
from minivllm.judge.bounded import call_bounded, open_fds, start_call
from minivllm.judge.polls import check_polls_time_left

READY = b"READY"
JOIN_S = scaled(5.0)  # subscriptions over loopback arrive in milliseconds
HANG_S = scaled(5.0)  # a call with a timeout under 1 s that has not returned by then hangs
EARLY_S = 0.01  # poll() rounds to whole milliseconds: a timeout may end this much early
READY_LATE_S = 0.3  # the judge sends READY this long after the readers start waiting
SILENT_T = 0.5  # the timeout given to calls against a silent or dead writer
TRICKLE_GAP_S, TRICKLE_N, TOTAL_T = 0.3, 8, 1.0  # one arrival every 0.3 s; 8 take 2.4 s
ROUNDS = 3  # a trickle round in which the judge could not keep its pace is run again
LEAVE_T = scaled(1.0)  # a reader that subscribes and leaves: the timeout for n=2


class Writer:
    """The judge's writer: an XPUB with XPUB_VERBOSE on a free loopback port."""

    def __init__(self, sndhwm: int = 0) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.XPUB)
        self.sock.setsockopt(zmq.XPUB_VERBOSE, 1)
        self.sock.setsockopt(zmq.SNDHWM, sndhwm)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind("tcp://127.0.0.1:0")
        self.address = self.sock.getsockopt(zmq.LAST_ENDPOINT).decode()

    def expect_subscribers(self, n: int) -> None:
        seen = 0
        while seen < n and self.sock.poll(int(JOIN_S * 1000)):
            seen += self.sock.recv()[:1] == b"\x01"
        if seen < n:
            raise Fail(f"the writer saw {seen} of {n} subscriptions within {JOIN_S:g} s: "
                       "RemoteReader must connect a SUB socket to the address and set "
                       "zmq.SUBSCRIBE to b'' (a SUB that subscribes to nothing gets nothing)")

    def close(self) -> None:
        self.sock.close()
        self.ctx.term()


def _call(fn, *args):
    """fn(*args) in a thread, given up on HANG_S after its own timeout (a float argument)."""
    return call_bounded(fn, *args, limit=HANG_S + max([a for a in args if isinstance(a, float)],
                                                      default=0))


@contextlib.contextmanager
def _bench(impl, n: int, ready: bool = False, sndhwm: int = 0):
    """The judge's writer and n of your readers, subscribed (and past READY if `ready`)."""
    w, readers = Writer(sndhwm), []
    try:
        for _ in range(n):
            step(f"RemoteReader(address) ({len(readers) + 1} of {n})")
            readers.append(impl.RemoteReader(w.address))
        w.expect_subscribers(n)
        if ready:
            w.sock.send(READY)
            for r in readers:
                r.wait_until_ready(HANG_S)
        yield w, readers
    finally:
        for i, r in enumerate(readers):
            t, out = _call(r.close)
            if t.is_alive():
                raise Fail(f"reader {i}'s close() did not return within {HANG_S:g} s while "
                           f"{len(readers) - i - 1} other reader(s) of this process were still "
                           "open: its ctx.term() waits for their sockets, so the readers share "
                           "one context. Each RemoteReader makes its own zmq.Context(), never "
                           "the process-wide zmq.Context.instance()")
            if "error" in out:
                raise out["error"]
        w.close()


@test(input=f"3 RemoteReaders; the judge's writer waits for 3 subscriptions and sends READY "
            f"{READY_LATE_S} s after the readers call wait_until_ready({HANG_S:g})")
def ready_handshake(impl):
    with _bench(impl, 3) as (w, readers):
        sender = threading.Timer(READY_LATE_S, w.sock.send, (READY,))
        sender.start()
        for i, r in enumerate(readers):
            step(f"reader {i}'s wait_until_ready({HANG_S:g}); READY is sent {READY_LATE_S} s "
                 "after the first reader's call")
            t, out = _call(r.wait_until_ready, HANG_S)
            if "error" in out:
                e = out["error"]
                why = (" The timeout is in seconds; zmq's poll() takes milliseconds."
                       if isinstance(e, TimeoutError) and out["seconds"] < HANG_S / 2 else "")
                raise Fail(f"reader {i}'s wait_until_ready({HANG_S:g}) raised "
                           f"{type(e).__name__} after {out['seconds']:.3f} s, but READY came "
                           f"{READY_LATE_S} s after the call.{why}", got=str(e)) from None
            if t.is_alive():
                raise Fail(f"reader {i}'s wait_until_ready did not return although READY was sent")
        sender.join()


@test(input="one RemoteReader; the writer's first message is [b'step 7', b'payload'], not READY; "
            "then another, whose first message is [b'READY', b'step 8'] (READY is one frame)")
def ready_is_checked(impl):
    for first, name in (([b"step 7", b"payload"], "step 7"), ([READY, b"step 8"], "")):
        _check_not_ready(impl, first, name)


def _check_not_ready(impl, first, name):
    with _bench(impl, 1) as (w, readers):
        w.sock.send_multipart(first)
        step(f"wait_until_ready({HANG_S:g}); the writer's first message is {first}")
        try:
            readers[0].wait_until_ready(HANG_S)
        except RuntimeError as e:
            if name not in str(e):
                raise Fail("the RuntimeError must name what came instead of READY",
                           expected=f"... {name} ...", got=str(e)) from None
            return
        except AssertionError:
            raise Fail("wait_until_ready raised AssertionError; the README asks for a "
                       "RuntimeError that names what came (an assert vanishes under "
                       "python -O)") from None
        why = (" (a reader that takes one frame with recv() sees only b'READY': a message is "
               "all the frames recv_multipart() returns; compare the whole message)"
               if first[0] == READY else "")
        raise Fail(f"wait_until_ready returned although the first message was {first}, not "
                   "[b'READY'] (one frame): this reader joined a writer that was already "
                   f"publishing and has missed messages; raise RuntimeError naming what came{why}")


DEAD_WRITER = """
import sys, time, zmq
ctx = zmq.Context()
x = ctx.socket(zmq.XPUB)
x.setsockopt(zmq.XPUB_VERBOSE, 1)
x.setsockopt(zmq.SNDHWM, 0)
x.bind("tcp://127.0.0.1:0")
print(x.getsockopt(zmq.LAST_ENDPOINT).decode(), flush=True)
while x.recv()[0] != 1:
    pass
x.send(b"READY")
i = 0
while True:
    x.send(b"tick %d" % i)
    i += 1
    time.sleep(0.002)
"""


def _check_timeout(out: dict, call: str, t: float, address: str, what: str) -> None:
    e = out.get("error")
    if not isinstance(e, TimeoutError):
        got = f"{type(e).__module__}.{type(e).__name__}: {e}" if e else repr(out.get("value"))
        raise Fail(f"{call} against {what} must raise TimeoutError; it gave {got[:200]}")
    if out["seconds"] < t - EARLY_S:
        raise Fail(f"{call} raised TimeoutError after {out['seconds']:.3f} s, before its "
                   f"{t:g} s were up: the timeout is in seconds; zmq's poll() takes "
                   "milliseconds")
    if address not in str(e):
        raise Fail(f"the TimeoutError of {call} must say which writer went quiet (its address) "
                   "so that an operator knows which node to look at", expected=f"... {address} ...",
                   got=str(e) or "(an empty message)")


@test(input=f"a writer that never sends READY; one that sends READY and then nothing; one "
            f"killed with SIGKILL while publishing every 2 ms; every call with timeout "
            f"{SILENT_T}", timeout=30)
def dead_or_silent_writer(impl):
    with _bench(impl, 1) as (w, [r]):
        step(f"wait_until_ready({SILENT_T}) against a writer that never sends READY")
        _, out = _call(r.wait_until_ready, SILENT_T)
        _check_timeout(out, f"wait_until_ready({SILENT_T})", SILENT_T, w.address,
                       "a writer that never sends READY")
        w.sock.send(READY)
        step(f"wait_until_ready({HANG_S:g}) after READY was sent")
        r.wait_until_ready(HANG_S)
        step(f"dequeue({SILENT_T}) against a writer that sent READY and then nothing")
        t, out = _call(r.dequeue, SILENT_T)
        if t.is_alive():
            w.sock.send(b"unblock")  # the judge sets it free, so that the test can end
            t.join(HANG_S)
            raise Fail(f"dequeue({SILENT_T}) against a silent writer had not returned after "
                       f"{HANG_S:g} s: poll() with the time left before every recv, never a "
                       "bare recv")
        _check_timeout(out, f"dequeue({SILENT_T})", SILENT_T, w.address, "a silent writer")
    _killed_mid_stream(impl)


def _killed_mid_stream(impl):
    proc = subprocess.Popen([sys.executable, "-c", DEAD_WRITER], stdout=subprocess.PIPE,
                            text=True)
    r = None
    try:
        address = proc.stdout.readline().strip()
        step("RemoteReader(address of a writer publishing every 2 ms), wait_until_ready, then "
             "dequeue() 20 times")
        r = impl.RemoteReader(address)
        r.wait_until_ready(JOIN_S)
        got = [[bytes(f) for f in r.dequeue(HANG_S)] for _ in range(20)]
        step(f"dequeue({SILENT_T}) until it raises, after the writer was killed (SIGKILL)")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        for _ in range(100_000):  # what was in flight still arrives, then nothing
            t, out = _call(r.dequeue, SILENT_T)
            if "value" not in out:
                break
            got.append([bytes(f) for f in out["value"]])
        where = "the writer was killed after your reader had read 20 messages"
        want = [[b"tick %d" % i] for i in range(len(got))]
        if got != want:
            k = next(i for i in range(len(got)) if got[i] != want[i])
            raise Fail(f"message {k} from a writer that later died is wrong: every message the "
                       "writer sent before it died arrives, in order", expected=want[k],
                       got=got[k], input=where)
        if t.is_alive():
            raise Fail(f"dequeue({SILENT_T}) after the writer died had not returned after "
                       f"{HANG_S:g} s", input=where)
        _check_timeout(out, f"dequeue({SILENT_T})", SILENT_T, address, "a dead writer")
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stdout.close()
        if r is not None:
            r.close()


def _messages() -> list[list[bytes]]:
    """Distinct multipart messages, every frame size at both sides of ZMQ's batch and 64 KiB."""
    rng = random.Random(431)
    sizes = [0, 1, 8191, 8192, 8193, 65535, 65536, 65537, (1 << 20) + 1]
    out = [[f"m{k}".encode(), rng.randbytes(n)] for k, n in enumerate(sizes)]
    out += [[b"only-frame"], [b"", b"", b"m-empty"], [b"m-three", b"a" * 3, rng.randbytes(70000)]]
    return out


def _shape(frames) -> str:
    return f"{len(frames)} frame(s) of {[len(f) for f in frames]} bytes"


BURST_N = 4000  # four times ZMQ's default SNDHWM of the writer's XPUB (vLLM keeps the default)
BURST_WAIT_S = scaled(2.0)  # a reader that takes from TCP empties the writer's queue in ms


@test(input="12 distinct multipart messages: frames of 0, 1, 8191-8193, 65535-65537 and "
            "1 MiB + 1 bytes, empty frames, 1 to 3 frames a message; then a burst of "
            f"{BURST_N} messages from a writer with ZMQ's default SNDHWM (1000) while the reader "
            "reads nothing, then dequeue them all")
def frames_in_order(impl):
    with _bench(impl, 1, ready=True) as (w, [r]):
        msgs = _messages()
        for m in msgs:
            w.sock.send_multipart(m)
        for k, want in enumerate(msgs):
            step(f"dequeue({HANG_S:g}) of message {k} ({_shape(want)})")
            got = r.dequeue(HANG_S)
            if not isinstance(got, list) or not all(type(f) is bytes for f in got):
                kinds = sorted({type(f).__name__ for f in got}) if isinstance(got, list) else []
                raise Fail(f"dequeue must return a list of bytes, one per frame; got "
                           f"{type(got).__name__} of {kinds}", input=f"message {k}")
            if got != want:
                why = ("a message is all the frames recv_multipart() returns; recv() gives one"
                       if len(got) != len(want) else "the frames' bytes must come back unchanged")
                raise Fail(f"message {k} came as {_shape(got)}, the writer sent "
                           f"{_shape(want)}: {why}", input=f"message {k} of {len(msgs)}")
    _burst(impl)


def _burst(impl) -> None:
    """vLLM's XPUB keeps ZMQ's default SNDHWM (1000): a PUB drops what a subscriber's queue
    cannot take. A reader whose SUB keeps reading TCP (RCVHWM 0, no limit) takes all of a burst
    it is not reading yet; one with a small RCVHWM stops reading, and the writer's queue fills.
    The judge's writer waits (XPUB_NODROP) where vLLM's would drop, so that a reader starved of
    CPU on a busy machine is told from one that stopped reading: only the latter leaves the
    writer's queue full for BURST_WAIT_S."""
    with _bench(impl, 1, ready=True, sndhwm=1000) as (w, [r]):
        w.sock.setsockopt(zmq.XPUB_NODROP, 1)
        w.sock.setsockopt(zmq.SNDTIMEO, int(BURST_WAIT_S * 1000))
        step(f"a burst of {BURST_N} messages while the reader reads nothing, then "
             f"dequeue({HANG_S:g}) until [b'end']")
        body = b"." * 1024
        for k in range(BURST_N + 1):
            try:
                w.sock.send(b"burst %d " % k + body if k < BURST_N else b"end")
            except zmq.Again:
                raise Fail(f"a burst of {BURST_N} messages sent while the reader read nothing: "
                           f"the writer's queue for your reader stayed full for "
                           f"{BURST_WAIT_S:g} s at message {k}. vLLM's XPUB keeps ZMQ's default "
                           "SNDHWM (1000) and drops what a subscriber does not take (the judge's "
                           "writer waits instead, to tell): the SUB must keep reading into its "
                           "own queue (RCVHWM 0: no limit), so that every message the writer "
                           "sent arrives, in order") from None
        got = []
        while (m := r.dequeue(HANG_S)) != [b"end"]:
            got.append(m)
        want = [[b"burst %d " % k + body] for k in range(BURST_N)]
        if got != want:
            k = next((i for i, (g, x) in enumerate(zip(got, want)) if g != x), len(got))
            raise Fail(f"a burst of {BURST_N} messages sent while the reader read nothing: "
                       f"{len(got)} arrived, the first wrong or missing is message {k}: every "
                       "message the writer sent arrives, in order",
                       expected=f"message {k}: burst {k}",
                       got=f"{bytes(got[k][0])[:12]!r}..." if k < len(got) else "nothing")


def _subscriber(ctx, address):
    s = ctx.socket(zmq.SUB)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(address)
    s.setsockopt(zmq.SUBSCRIBE, b"")
    return s


@test(input="your wait_for_readers on the judge's XPUB: (a) 2 of 3 SUBs subscribed, the "
            "third joins later, n=3; (b) one SUB subscribes and leaves, n=2; (c) n=0, no SUB; "
            "(d) n=1 with timeout 0.5, the SUB's subscription already in",
      timeout=20)
def writer_waits_for_every_reader(impl):
    w, ctx = Writer(), zmq.Context()
    subs = [_subscriber(ctx, w.address) for _ in range(2)]
    try:
        step(f"(a) wait_for_readers(xpub, 3, {HANG_S:g}), 2 of 3 SUBs subscribed, the third later")
        t, out = start_call(impl.wait_for_readers, w.sock, 3, HANG_S)
        if subs[0].poll(int(scaled(0.5) * 1000)):  # nothing may come before the third joins
            raise Fail("READY was sent after 2 of 3 subscriptions: the third reader misses "
                       "it (and waits for it forever)", got=subs[0].recv())
        subs.append(_subscriber(ctx, w.address))
        t.join(HANG_S)
        if "error" in out:
            raise Fail(f"wait_for_readers(3) raised {out['error']!r} although 3 readers "
                       "subscribed") from None
        for i, s in enumerate(subs):
            got = s.recv() if s.poll(int(JOIN_S * 1000)) else None
            if got != READY:
                raise Fail(f"reader {i} got no READY after all 3 had subscribed: once n "
                           "readers have subscribed, send READY, which they wait for", got=got)
        _reader_leaves(impl, ctx)
        _no_readers(impl)
        _short_timeout(impl, ctx)
    finally:
        for s in subs:
            s.close()
        ctx.term()
        w.close()


def _short_timeout(impl, ctx) -> None:
    """A subscription already in the XPUB: wait_for_readers(xpub, 1, 0.5) takes it."""
    w, sub = _taken_in(ctx)
    try:
        step("(d) wait_for_readers(xpub, 1, 0.5), the SUB's subscription already in")
        try:
            impl.wait_for_readers(w.sock, 1, 0.5)
        except TimeoutError as e:
            raise Fail("wait_for_readers(xpub, 1, 0.5) raised TimeoutError although the reader's "
                       "subscription was already in the XPUB: a timeout under one second still "
                       "waits for what is there", got=str(e)) from None
    finally:
        sub.close()
        w.close()


def _taken_in(ctx):
    """A writer and one SUB whose subscription the writer's XPUB has taken in."""
    w = Writer()
    sub = _subscriber(ctx, w.address)
    while not sub.poll(20):
        w.sock.send(b"probe")
    return w, sub


def _reader_leaves(impl, ctx) -> None:
    w, sub = _taken_in(ctx)
    try:
        sub.close()  # subscribed, now leaves: the XPUB holds b"\x01" then b"\x00"
        step(f"(b) wait_for_readers(xpub, 2, {LEAVE_T:g}): one SUB subscribed and left")
        try:  # the leave reaches the XPUB in milliseconds; the timeout stretches with load
            impl.wait_for_readers(w.sock, 2, LEAVE_T)
        except TimeoutError as e:
            if "1 of 2" not in str(e):
                raise Fail("the TimeoutError must say how many readers subscribed",
                           expected="... 1 of 2 ...", got=str(e)) from None
            return
        raise Fail("wait_for_readers(n=2) returned after one reader subscribed and left: "
                   "count only subscriptions (first byte 1); b'\\x00' is a reader leaving")
    finally:
        sub.close()
        w.close()


def _no_readers(impl) -> None:
    w = Writer()
    step(f"(c) wait_for_readers(xpub, 0, {LEAVE_T:g}), no SUB")
    try:
        impl.wait_for_readers(w.sock, 0, LEAVE_T)
    except TimeoutError as e:
        raise Fail("wait_for_readers(xpub, 0, ...) raised TimeoutError: with no remote reader "
                   "to wait for, it sends READY at once (check the count before waiting)",
                   got=str(e)) from None
    finally:
        w.close()


def _trickle(pace, call, what: str, address: str = ""):
    """Run call() while pace(k) makes arrival k every TRICKLE_GAP_S. The verdict: did call
    raise TimeoutError (naming `address`) before all TRICKLE_N had arrived? A round in which
    the judge's own gaps reached TOTAL_T (a stalled machine) proves nothing and is run again."""
    for _ in range(ROUNDS):
        stop, stamps = threading.Event(), [time.monotonic()]

        def pacer():
            for k in range(TRICKLE_N):
                if stop.wait(TRICKLE_GAP_S):
                    return
                pace(k)
                stamps.append(time.monotonic())
        th = threading.Thread(target=pacer)
        th.start()
        error = None
        try:
            value = call()
        except TimeoutError as e:
            if f"of {TRICKLE_N}" not in str(e) or address not in str(e):
                raise Fail("the TimeoutError must say how many came" + (
                           " and name the writer's address" if address else ""),
                           expected=f"... 3 of {TRICKLE_N} ... {address}", got=str(e)) from None
            error = str(e)
        finally:
            stop.set()
            th.join()
        if error is not None:
            return error, len(stamps) - 1  # the message, and how many arrivals were made
        if isinstance(value, list) and len(value) < TRICKLE_N:
            raise Fail(f"{what} returned {len(value)} of {TRICKLE_N} messages when its deadline "
                       f"passed: raise TimeoutError('{len(value)} of {TRICKLE_N} ...') instead, "
                       "so that the caller cannot take a short batch for a whole one")
        if max(b - a for a, b in zip(stamps, stamps[1:])) < TOTAL_T:
            break  # the pace was kept: every arrival came well within the per-wait timeout
    else:
        raise Fail(f"the judge could not keep its pace in {ROUNDS} rounds (the machine is "
                   "stalled); run the judge again")
    raise Fail(f"{what} returned {value!r:.80} although its total timeout of {TOTAL_T:g} s "
               f"ran out: arrivals came one every {TRICKLE_GAP_S} s, the last "
               f"{stamps[-1] - stamps[0]:.1f} s after the start. The timeout is one deadline for "
               "the whole call (deadline - now before each poll), not a wait per arrival; when "
               f"it passes, raise TimeoutError('k of {TRICKLE_N} ...')")


@test(input=f"wait_for_readers(xpub, {TRICKLE_N}, {TOTAL_T}) while a SUB joins every "
            f"{TRICKLE_GAP_S} s", timeout=30)
def wait_deadline_is_total(impl):
    ctx, subs = zmq.Context(), []
    w = Writer()
    try:
        step(f"wait_for_readers(xpub, {TRICKLE_N}, {TOTAL_T:g}) while a SUB joins every "
             f"{TRICKLE_GAP_S} s")
        _trickle(lambda k: subs.append(_subscriber(ctx, w.address)),
                 lambda: impl.wait_for_readers(w.sock, TRICKLE_N, TOTAL_T),
                 f"wait_for_readers(n={TRICKLE_N}, timeout={TOTAL_T:g})")
        _check_nothing_sent(w, subs)
        step(f"wait_for_readers(xpub, {TRICKLE_N + 1}, timeout) on a clock that stands still")
        check_polls_time_left(lambda t: impl.wait_for_readers(w.sock, TRICKLE_N + 1, t),
                              f"wait_for_readers(xpub, {TRICKLE_N + 1}, timeout)", HANG_S)
    finally:
        for s in subs:
            s.close()
        ctx.term()
        w.close()


def _check_nothing_sent(w, subs) -> None:
    """After wait_for_readers timed out, the first message each SUB gets is the judge's."""
    for i, s in enumerate(subs):
        deadline = time.monotonic() + JOIN_S
        while not s.poll(20) and time.monotonic() < deadline:
            w.sock.send(b"after")  # until this SUB's subscription is in
        got = s.recv() if s.poll(0) else None
        if got != b"after":
            raise Fail(f"reader {i} got {got!r} from a wait_for_readers that timed out: on "
                       "timeout raise and send nothing (a READY would start readers that are "
                       "not all there)", expected=b"after", got=got)


@test(input=f"read(3, {HANG_S:g}) of 4 queued messages; read(0); dequeue; then "
            f"read({TRICKLE_N}, {TOTAL_T}) while a "
            f"message comes every {TRICKLE_GAP_S} s", timeout=30)
def read_deadline_is_total(impl):
    with _bench(impl, 1, ready=True) as (w, [r]):
        for k in range(4):
            w.sock.send_multipart([b"queued", str(k).encode()])
        want = [[b"queued", str(k).encode()] for k in range(3)]
        step(f"read(3, {HANG_S:g}) with 4 messages queued")
        got = r.read(3, HANG_S)
        if got != want:
            raise Fail("read(3) must return exactly 3 messages, each the list of its frames, in "
                       "order", expected=want, got=got, input="4 messages queued")
        step(f"read(0, {HANG_S:g}), then dequeue({HANG_S:g})")
        check_equal(r.read(0, HANG_S), [], "read(0) with a 4th message queued (it takes none)")
        check_equal(r.dequeue(HANG_S), [b"queued", b"3"], "dequeue() after read(0)")
        step(f"read({TRICKLE_N}, {TOTAL_T:g}) while a message comes every {TRICKLE_GAP_S} s")
        message, sent = _trickle(lambda k: w.sock.send_multipart([b"trickle", str(k).encode()]),
                                 lambda: r.read(TRICKLE_N, TOTAL_T),
                                 f"read({TRICKLE_N}, {TOTAL_T:g})", w.address)
        _check_count_told(w, r, message, sent)
        step("dequeue, read(1, ...), wait_until_ready, each with a timeout, on a clock that "
             "stands still")
        check_polls_time_left(r.dequeue, "dequeue(timeout)", HANG_S)
        check_polls_time_left(lambda t: r.read(1, t), "read(1, timeout)", HANG_S)
        check_polls_time_left(r.wait_until_ready, "wait_until_ready(timeout)", HANG_S)


def _check_count_told(w, r, message: str, sent: int) -> None:
    """The k in 'k of 8' is what read took: the messages after it are still in the socket."""
    w.sock.send(b"end")
    left = []
    while (m := r.dequeue(HANG_S)) != [b"end"]:
        left.append(m)
    took = sent - len(left)
    if f"{took} of {TRICKLE_N}" not in message:
        raise Fail(f"read's TimeoutError must say how many messages it took ({took} of the "
                   f"{sent} sent; {len(left)} were still unread)",
                   expected=f"... {took} of {TRICKLE_N} ...", got=message)


@test(input="RemoteReader: READY, one message, close(), close(); then one whose writer is gone")
def close_releases_everything(impl):
    w = Writer()
    before = open_fds()
    try:
        step("RemoteReader(address), wait_until_ready, dequeue, close(), close()")
        r = impl.RemoteReader(w.address)
        w.expect_subscribers(1)
        w.sock.send(READY)
        r.wait_until_ready(HANG_S)
        w.sock.send(b"one")
        check_equal(r.dequeue(HANG_S), [b"one"], "the message before close()")
        r.close()
        r.close()
        left = sorted(open_fds() - before)
        if left:
            raise Fail(f"close() left {len(left)} file descriptor(s) open: close the socket "
                       "and terminate this reader's own zmq.Context (ctx.term()); a shared "
                       "Context.instance() keeps its fds for the whole process", got=left[:6])
    finally:
        w.close()
    step("RemoteReader(address of a writer that is gone), close()")
    r = impl.RemoteReader(w.address)  # its writer has closed: close() must not wait for it
    t, out = _call(r.close)
    if t.is_alive() or "error" in out:
        raise Fail("close() of a reader whose writer is gone did not return cleanly",
                   got=repr(out.get("error", "still running")))
    left = sorted(open_fds() - before)
    if left:
        raise Fail(f"close() of a reader whose writer is gone left {len(left)} fd(s) open",
                   got=left[:6])
