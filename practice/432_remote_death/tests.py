"""The judge's tests for exercise 432. Each receives the learner's module as `impl`.

Every peer is a real TCP connection on 127.0.0.1: the judge holds one end (in this process,
or in a peer process that it pauses with SIGSTOP or kills with SIGKILL), and your PeerWatch
owns the other. Time is the judge's FakeClock, moved only by the test, and before each check()
the judge waits until what it sent has reached your socket (select on it says readable): no
verdict depends on how fast the machine is.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

from minivllm.judge.api import Fail, check_equal, scaled, step, test
from minivllm.judge.bounded import call_bounded, open_fds

ARRIVE_S = scaled(5.0)  # a byte or FIN on loopback arrives in microseconds; this is a hang guard
D = 10.0  # the deadline, in the FakeClock's seconds
ENDED_S = scaled(1.0)  # close() queues the FIN itself: this wait only finds one never sent


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _pairs(names):
    """{name: (your end, the judge's end)}, each a connected loopback TCP pair."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        out = {}
        for name in names:
            theirs = socket.create_connection(listener.getsockname())
            yours, _ = listener.accept()
            out[name] = (yours, theirs)
        return out


def _arrived(yours, what: str) -> None:
    """Wait until `yours` holds a byte (or an end: select says readable). Hang guard only."""
    if not select.select([yours], [], [], ARRIVE_S)[0]:
        raise Fail(f"the judge's {what} did not reach your socket within {ARRIVE_S:g} s: did "
                   "your code close or replace a socket it was given?")


def _beat(pairs, *names, count=1, byte=b"."):
    for n in names:
        pairs[n][1].sendall(byte * count)
    for n in names:
        _arrived(pairs[n][0], f"heartbeat from {n}")


def _check(watch, wait=0.0, where=""):
    """watch.check(wait) in a thread: a check() that blocks on a quiet peer fails, not hangs."""
    step(f"check({wait:g})" + (f" ({where})" if where else ""))
    t, out = call_bounded(watch.check, wait, limit=ARRIVE_S + wait)
    if t.is_alive():
        raise Fail(f"check({wait:g}) had not returned after {ARRIVE_S + wait:g} s: it blocked on "
                   "a quiet peer. Wait only in select (at most `wait`), and read only sockets "
                   "that are ready, without blocking", input=where)
    if "error" in out:
        e = out["error"]
        if isinstance(e, ConnectionResetError):
            raise Fail("check() let ConnectionResetError out: a reset connection (RST) is a "
                       "dead peer, reported as 'closed'", input=where) from None
        raise e
    return out["value"]


@contextlib.contextmanager
def _watching(impl, names):
    """A FakeClock, the pairs and your PeerWatch over your ends; closed however the test ends."""
    clock, pairs, watch = FakeClock(), _pairs(names), None
    try:
        step(f"PeerWatch(sockets of {list(names)}, {D:g}, clock)")
        watch = impl.PeerWatch({n: p[0] for n, p in pairs.items()}, D, clock)
        yield clock, pairs, watch
    finally:
        try:
            if watch is not None:
                watch.close()
        finally:
            for yours, theirs in pairs.values():
                theirs.close()


@test(input=f"PeerWatch({{}}, deadline) for 0, -1.5 (refused) and 0.5; peers A and B, deadline "
            f"{D:g}; A beats at t=4; check at t=14 (A exactly at its deadline, B past it), at "
            "t=14.000001, at t=30")
def silent_peer_deadline(impl):
    _check_deadline_argument(impl)
    with _watching(impl, "AB") as (clock, pairs, watch):
        t0 = clock.now
        clock.now = t0 + 4
        _beat(pairs, "A")
        got = _check(watch, where="t=4, A just beat")
        if got:
            raise Fail(f"check() at t=4 of the clock you were given (4 s after the watch was "
                       f"made, deadline {D:g} s) reported {got}: nobody is past the deadline "
                       "yet. A peer never heard counts as heard at clock() when the watch was "
                       "made, and all time comes from `clock` (the judge's fake clock), never "
                       "time.monotonic()", expected={}, got=got)
        clock.now = t0 + 4 + D
        got = _check(watch, where="t=14")
        if got.get("A"):
            raise Fail(f"A was reported {got['A']!r} at t=14, exactly the deadline ({D:g} s) "
                       "after its beat at t=4: a beat read moves the peer's last-heard time to "
                       "that check's clock(), and a peer is silent only when MORE than the "
                       "deadline has passed since", got=got)
        if got != {"B": impl.SILENT}:
            raise Fail(f"B has not been heard since the watch began (t=0) and the clock says "
                       f"t=14 > {D:g}: check() must report it SILENT. Take time from the `clock` "
                       "you were given, from the start for a peer that never beat",
                       expected={"B": impl.SILENT}, got=got)
        _ended(pairs["B"][1], "B, once reported")
        clock.now = t0 + 4 + D + 1e-6
        check_equal(_check(watch, where="t=14.000001"), {"A": impl.SILENT},
                    "check() just past A's deadline (B was reported before: report a peer once)")
        clock.now = t0 + 30
        check_equal(_check(watch, where="t=30"), {}, "check() after both were reported: each "
                    "peer is reported once")


def _check_deadline_argument(impl):
    for bad in (0, -1.5):
        step(f"PeerWatch({{}}, {bad})")
        try:
            impl.PeerWatch({}, bad).close()
        except ValueError as e:
            if str(bad) not in str(e):
                raise Fail(f"PeerWatch({{}}, {bad}) raised ValueError without the deadline it was "
                           "given: say what was wrong", expected=f"... {bad} ...",
                           got=str(e)) from None
            continue
        raise Fail(f"PeerWatch({{}}, {bad}) must raise ValueError: a deadline is > 0 seconds")
    step("PeerWatch({}, 0.5), then close()")
    try:
        impl.PeerWatch({}, 0.5).close()
    except ValueError as e:
        raise Fail("PeerWatch({}, 0.5) raised ValueError: any deadline > 0 seconds is a deadline, "
                   "also one under a second", got=str(e)) from None


def _ended(theirs, who: str) -> None:
    if not select.select([theirs], [], [], ENDED_S)[0] or theirs.recv(1) != b"":
        raise Fail(f"the connection of {who} is still open: close the socket of a peer you "
                   "report, and stop watching it")


@test(input=f"peers A, B, C, deadline {D:g}: all three beat every 9 s of clock (A b'.', "
            "B b'\\x00', C in bursts of 3 b'\\n'), for 90 s; a check right after each round")
def slow_alive_peers(impl):
    with _watching(impl, "ABC") as (clock, pairs, watch):
        t0 = clock.now
        for step in range(1, 11):
            clock.now = t0 + 9 * step
            _beat(pairs, "A")
            _beat(pairs, "B", byte=b"\x00")
            _beat(pairs, "C", count=3, byte=b"\n")
            got = _check(watch, where=f"t={9 * step}, all three just beat")
            if got:
                raise Fail(f"false alarm at t={9 * step}: {got}, but every peer beats every 9 s, "
                           f"within the {D:g} s deadline, and had just beaten. Read every ready "
                           "socket in each check, and count a beat at the time it is read (a "
                           "beat is any bytes)",
                           input="beats every 9 s, a check after each round")


@test(input=f"peers A and B, deadline {D:g}: both beat while the detector is stalled for 50 s of "
            "clock; check at t=50; then silence; check at t=61")
def detector_stall(impl):
    with _watching(impl, "AB") as (clock, pairs, watch):
        t0 = clock.now
        for k in range(1, 6):  # the peers beat every 10 s; the detector does not run
            clock.now = t0 + 10 * k
            _beat(pairs, "A", "B")
        got = _check(watch, where="t=50, the beats of t=10..50 unread in your sockets")
        if got:
            raise Fail("false alarm after the detector itself stalled: both peers beat every "
                       "10 s and their beats were waiting in your sockets, but check() judged "
                       "before reading them. Read what has arrived first, then judge",
                       expected={}, got=got)
        clock.now = t0 + 50 + D + 1
        got = _check(watch, where="t=61, nothing since t=50")
        if got != {"A": impl.SILENT, "B": impl.SILENT}:
            raise Fail(f"A and B last beat at t=50 and the clock says t=61, past the {D:g} s "
                       "deadline: both are silent. Their 5 beats each came at once: read "
                       "everything that has arrived in one check, not a piece per check",
                       expected={"A": impl.SILENT, "B": impl.SILENT}, got=got)


@test(input="the signature of PeerWatch.check; check(wait) while the judge sends a beat 0.3 s "
            "after the call starts; then check(0.3) with nothing coming and the clock standing "
            "still")
def check_waits(impl):
    default = inspect.signature(impl.PeerWatch.check).parameters["wait"].default
    if default != 0.0:
        raise Fail("the default `wait` of PeerWatch.check: the README fixes check(wait=0.0), so "
                   "a caller's check() on quiet sockets returns at once instead of blocking",
                   expected=0.0, got=default)
    with _watching(impl, "A") as (clock, pairs, watch):
        wait, sent = ARRIVE_S, []
        timer = threading.Timer(0.3, lambda: (sent.append(time.monotonic()),
                                              pairs["A"][1].sendall(b".")))
        start = time.monotonic()
        timer.start()
        got = _check(watch, wait, where=f"check({wait:g}); a beat comes after 0.3 s")
        end = time.monotonic()
        timer.join()
    check_equal(got, {}, "check() that heard a beat")
    if not sent or end < sent[0]:
        raise Fail(f"check({wait:g}) returned after {end - start:.3f} s, before the beat was "
                   "sent (at 0.3 s) and with nothing to report: wait up to `wait` seconds "
                   "for something to arrive (select with a timeout)")
    if end - start >= wait:
        raise Fail(f"check({wait:g}) took {end - start:.2f} s although a beat arrived after "
                   "0.3 s: return as soon as something arrives, not after the whole wait")
    with _watching(impl, "A") as (clock, pairs, watch):  # the clock stands still meanwhile
        got = _check(watch, 0.3, where="check(0.3), nothing comes: `wait` is real time, not "
                                        "the clock's")
        check_equal(got, {}, "check(0.3) with nothing coming")


PEER = """
import socket, sys
s = socket.socket(fileno=int(sys.argv[1]))
for line in sys.stdin:
    s.sendall(b".")
"""


def _peer_process(theirs):
    proc = subprocess.Popen([sys.executable, "-c", PEER, str(theirs.fileno())],
                            stdin=subprocess.PIPE, text=True, pass_fds=(theirs.fileno(),))
    theirs.close()  # only the peer holds its end now: its death closes the connection
    return proc


@contextlib.contextmanager
def _reaped(procs: dict):
    """Kill (SIGKILL ends a stopped process too) and reap every peer process the test started."""
    try:
        yield
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()
            proc.stdin.close()


def _tell_beat(proc, pairs, name):
    proc.stdin.write("beat\n")
    proc.stdin.flush()
    _arrived(pairs[name][0], f"heartbeat from peer process {name}")


@test(input=f"deadline {D:g}; peer processes P0 and P1 and an in-process peer R beat at t=2; "
            "then P0 gets SIGSTOP, P1 beats once more and gets SIGKILL, R resets its connection "
            "(RST); check at t=7; peer Q, never heard, closes; check at t=13", timeout=30)
def dead_vs_paused_peer(impl):
    procs = {}
    with _watching(impl, ["P0", "P1", "R", "Q"]) as (clock, pairs, watch), _reaped(procs):
        t0 = clock.now
        procs.update({n: _peer_process(pairs[n][1]) for n in ("P0", "P1")})
        clock.now = t0 + 2
        for n, proc in procs.items():
            _tell_beat(proc, pairs, n)
        _beat(pairs, "R")
        check_equal(_check(watch, where="t=2, all beat"), {}, "check() at t=2")
        os.kill(procs["P0"].pid, signal.SIGSTOP)
        _tell_beat(procs["P1"], pairs, "P1")  # a last beat, then the end, read in one check
        os.kill(procs["P1"].pid, signal.SIGKILL)
        procs["P1"].wait()
        _arrived(pairs["P1"][0], "end of P1's connection (its process was killed)")
        pairs["R"][1].setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        pairs["R"][1].close()  # linger 0: the kernel sends RST, not FIN
        _arrived(pairs["R"][0], "RST on R's connection")
        clock.now = t0 + 7
        got = _check(watch, where="t=7: P0 stopped, P1 killed, R reset, 5 s after their beats")
        want = {"P1": impl.CLOSED, "R": impl.CLOSED}
        if got != want:
            raise Fail("a peer whose connection ended (FIN after its process died, or RST) is "
                       "dead now, whatever the clock says: report it CLOSED at once (recv "
                       "returns b'' or raises ConnectionResetError), also when a beat came "
                       "just before the end. A stopped peer's connection stays open: it is not "
                       "dead before its deadline", expected=want, got=got)
        for n in want:
            if pairs[n][0].fileno() != -1:
                raise Fail(f"{n} was reported CLOSED, and the watch's end of its connection is "
                           "still open: close the socket of every peer you report, a dead one's "
                           "too (its file descriptor stays until you do)")
        pairs["Q"][1].close()
        _arrived(pairs["Q"][0], "end of Q's connection")
        clock.now = t0 + 2 + D + 1
        check_equal(_check(watch, where="t=13: P0 stopped since t=2; Q never heard, closed"),
                    {"P0": impl.SILENT, "Q": impl.CLOSED}, "check() 11 s after the stopped "
                    "peer's last beat (Q's connection ended: CLOSED, though past its deadline "
                    "too)")


@test(input=f"two PeerWatch side by side, one over A, one over B, each with its own clock, "
            f"deadline {D:g}: A's clock at t=11 and B's at t=5, then B's at t=11")
def watches_side_by_side(impl):
    with _watching(impl, "A") as (clock_a, _, watch_a), \
            _watching(impl, "B") as (clock_b, _, watch_b):
        t0 = clock_a.now
        clock_a.now, clock_b.now = t0 + D + 1, t0 + 5
        check_equal(_check(watch_a, where="A's watch at t=11"), {"A": impl.SILENT},
                    "check() of the watch over A at t=11 (B belongs to the other watch)")
        check_equal(_check(watch_b, where="B's watch at t=5"), {},
                    "check() of the watch over B at t=5 of its own clock")
        clock_b.now = t0 + D + 1
        check_equal(_check(watch_b, where="B's watch at t=11"), {"B": impl.SILENT},
                    "check() of the watch over B at t=11 of its own clock")


@test(input="PeerWatch over 3 peers; a beat; check(); close(); close()")
def close_releases(impl):
    before = open_fds()
    clock, pairs = FakeClock(), _pairs("ABC")
    try:
        step(f"PeerWatch(sockets of A, B, C, {D:g}, clock)")
        watch = impl.PeerWatch({n: p[0] for n, p in pairs.items()}, D, clock)
        _beat(pairs, "A", "B", "C")
        check_equal(_check(watch), {}, "check() after a beat from each")
        step("close(), then close() again")
        watch.close()
        watch.close()
        for n, (_, theirs) in pairs.items():
            _ended(theirs, f"peer {n} after close()")
    finally:
        for _, theirs in pairs.values():
            theirs.close()
    left = sorted(open_fds() - before)
    if left:
        raise Fail(f"close() left {len(left)} file descriptor(s) open: close every watched "
                   "socket and the selector (epoll) too", got=left)
