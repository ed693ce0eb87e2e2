"""The judge's tests for exercise 202. Each receives the learner's module as `impl`.

Subscribers are real processes (`python -c ...`): the judge's own, which start late on purpose
so that a publisher that does not wait loses messages every time, and the learner's `receive`.
Every address is an ipc:// file in a private directory under the judge's $TMPDIR.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import zmq

from minivllm.judge import procfs
from minivllm.judge.api import Fail, check_equal, kill_if_alive, scaled, step, test
from minivllm.judge.polls import PollLog, check_polls_time_left
from minivllm.utils.zmq import IpcDir

LATE_S = 0.5  # the judge's subscribers connect this long after they start: the slow joiner
JOIN_S = scaled(8.0)  # subscriber processes starting (and LATE_S) take far less than this
QUIET_S = scaled(2.0)  # a subscriber that hears nothing for this long gives up
YOUR_JOIN_S = 5.0  # the learner's subscribers start at once: plenty, and a cheap failure
IN_PROCESS_JOIN_S = 2.0  # SUB sockets in the judge's own process subscribe within milliseconds

RECEIVE_CODE = ("import json, sys, {module} as m; "
                "print(json.dumps([x.decode('latin-1') for x in m.receive(sys.argv[1], int(sys.argv[2]), "
                "float(sys.argv[3]))]))")
S = scaled(1.0)  # the trickles stretch with the judge's time limits (polls.POLL_SLACK_S)
TRICKLE_S, TRICKLE_IDLE_S = 0.4 * S, 1.0 * S  # a message every 0.4 s to a receive(timeout=1.0)
TRICKLE_ROUNDS = 3  # a trickle the judge could not pace is run again

JUDGE_SUBSCRIBER = """
import json, sys, time, zmq
address, late, count, quiet = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
time.sleep(late)
ctx = zmq.Context()
sub = ctx.socket(zmq.SUB)
sub.setsockopt(zmq.LINGER, 0)
sub.connect(address)
sub.setsockopt(zmq.SUBSCRIBE, b"")
got = []
while len(got) < count and sub.poll(int(quiet * 1000)):
    got.append(sub.recv().decode())
sub.close()
ctx.term()
print(json.dumps(got))
"""


def _start(code, *args):
    return subprocess.Popen([sys.executable, "-c", code, *map(str, args)], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _collect(procs, what, limit=None):
    """Each subscriber process's list of messages; kills and fails on a stuck or crashed one
    (one still running `limit` s from now; by default long enough to start and join)."""
    results = []
    for i, proc in enumerate(procs):
        try:
            out, err = proc.communicate(timeout=limit or JOIN_S + QUIET_S + 5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise Fail(f"{what} {i} did not finish: receive() must give up after `timeout` "
                       "seconds without a message")
        if proc.returncode != 0:
            raise Fail(f"{what} {i} exited with code {proc.returncode}", detail=err[-2000:])
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def _check_all_received(results, messages, what):
    for i, got in enumerate(results):
        if got != messages:
            first = f"; the first it got was {got[0]!r}" if got else ""
            raise Fail(f"{what} {i} received {len(got)} of {len(messages)} messages{first}. A "
                       "message published before a subscriber's subscription has reached the "
                       "publisher is dropped (the slow joiner): wait for every subscription "
                       "before publishing", expected=f"{messages[:3]}... ({len(messages)})",
                       got=f"{got[:3]}... ({len(got)})")


@test(input="3 SUB sockets subscribe to b''; wait_for_subscribers(3, 2.0)")
def counts_every_subscriber(impl):
    with IpcDir() as d:
        ctx = zmq.Context()
        pub = impl.Publisher(d.path("pub"))
        subs = [ctx.socket(zmq.SUB) for _ in range(3)]
        try:
            for s in subs:
                s.setsockopt(zmq.LINGER, 0)
                s.connect(d.path("pub"))
                s.setsockopt(zmq.SUBSCRIBE, b"")
            try:
                seen = pub.wait_for_subscribers(3, IN_PROCESS_JOIN_S)
            except TimeoutError as e:
                why = ("By default an XPUB passes on only the first subscription to a topic: "
                       "set XPUB_VERBOSE" if "1 of 3" in str(e) else
                       "Only an XPUB (not a PUB) hands subscriptions to recv()")
                raise Fail("wait_for_subscribers(3) timed out although 3 SUB sockets had "
                           f"subscribed to b'' (TimeoutError: {e}). {why}") from None
            check_equal(seen, 3, "wait_for_subscribers(3, 2.0)")
        finally:
            for s in subs:
                s.close()
            pub.close()
            ctx.term()


@test(input="Publisher(ipc address); close(); close(); the judge holds zmq.Context.instance()")
def close_removes_socket_file(impl):
    shared = zmq.Context.instance()  # the process-wide context: other code's sockets live on it
    with IpcDir() as d:
        before = procfs.fd_count()
        pub = impl.Publisher(d.path("pub"))
        path = os.path.join(d.dir, "pub")
        if not os.path.exists(path):
            raise Fail(f"Publisher() must bind its XPUB: {path} does not exist")
        pub.close()
        if shared.closed:
            raise Fail("close() terminated the process-wide zmq.Context.instance(), which other "
                       "code in the process shares: Publisher creates and terminates its own "
                       "context (zmq.Context())")
        if os.path.exists(path):
            raise Fail("after close() the socket file still exists: libzmq 4.3 does not remove "
                       "the file of a bound ipc:// socket; close() must os.unlink it", got=path)
        opened = procfs.fd_count() - before
        if opened > 0:
            raise Fail(f"close() left {opened} file descriptors open: close the socket and "
                       "terminate the context (ctx.term())", expected=0, got=opened)
        pub.close()


SIDE_BY_SIDE_CODE = ("import sys, {module} as m; a, b = m.Publisher(sys.argv[1]), "
                     "m.Publisher(sys.argv[2]); a.close(); b.publish(b'still here'); b.close(); "
                     "print('closed')")


@test(input="in a process: Publisher A and Publisher B side by side; A.close(); then "
            "B.publish(b'still here'); B.close()", timeout=30)
def publishers_side_by_side(impl):
    with IpcDir() as d:  # in a process of its own: a close() that hangs there is killed cleanly
        proc = _start(SIDE_BY_SIDE_CODE.format(module=impl.__name__), d.path("a"), d.path("b"))
        try:
            out, err = proc.communicate(timeout=JOIN_S)
        except subprocess.TimeoutExpired:
            raise Fail(f"A.close() and B.close() had not returned {JOIN_S:g} s later, in a "
                       "process with Publishers A and B side by side: A's ctx.term() waits for "
                       "B's socket when they share a context. Each Publisher creates and "
                       "terminates its own (zmq.Context() in __init__)") from None
        finally:
            kill_if_alive(proc)
        if proc.returncode != 0 or "closed" not in out:
            raise Fail(f"the process with Publishers A and B side by side exited with code "
                       f"{proc.returncode}", detail=err[-2000:])


STUCK_MESSAGES, STUCK_BYTES = 3000, 65536  # far more than a stopped reader's socket buffer takes


@test(input=f"a subscriber process subscribes, then is stopped (SIGSTOP); publish {STUCK_MESSAGES} "
            f"messages of {STUCK_BYTES} bytes; close()", timeout=30)
def close_with_a_stopped_subscriber(impl):
    linger_s = getattr(impl, "PUBLISH_LINGER_MS", 1000) / 1000
    with IpcDir() as d:
        pub = impl.Publisher(d.path("pub"))
        proc = _start(JUDGE_SUBSCRIBER, d.path("pub"), 0, 10**9, 3600)
        try:
            pub.wait_for_subscribers(1, JOIN_S)
            os.kill(proc.pid, signal.SIGSTOP)  # alive and connected, reading nothing
            for _ in range(STUCK_MESSAGES):
                pub.publish(b"x" * STUCK_BYTES)
            closing = threading.Thread(target=pub.close, daemon=True)
            closing.start()
            closing.join(linger_s + scaled(3.0))
            if closing.is_alive():
                raise Fail(f"close() had not returned {linger_s + scaled(3.0):g} s after it began, "
                           "with messages still queued for a subscriber that stopped reading: "
                           "ctx.term() waits for queued messages as long as the socket's linger "
                           "says, forever by default. Set zmq.LINGER to PUBLISH_LINGER_MS")
        finally:
            kill_if_alive(proc)


@test(input=f"3 subscriber processes connect {LATE_S} s after they start; "
            "wait_for_subscribers(3, 8.0); publish 100 messages", timeout=30)
def slow_joiners(impl):
    messages = [f"msg {i}" for i in range(100)]
    with IpcDir() as d:
        pub = impl.Publisher(d.path("pub"))
        procs = [_start(JUDGE_SUBSCRIBER, d.path("pub"), LATE_S, len(messages), QUIET_S)
                 for _ in range(3)]
        try:
            pub.wait_for_subscribers(3, JOIN_S)
            for m in messages:
                pub.publish(m.encode())
            results = _collect(procs, "subscriber")
        finally:
            kill_if_alive(*procs)
            pub.close()
        _check_all_received(results, messages, "subscriber")


DRAIN_MESSAGES, DRAIN_BYTES = 300, 16384  # far more than the socket buffers and a RCVHWM of 10 take


def _close_when_reached(pub) -> tuple[threading.Thread, threading.Event]:
    """pub.close() in a thread; the event is set once zmq's Socket.close has returned (the
    socket is closed and its linger runs), so that the judge reads only after the learner's
    socket is closed: a reader let in earlier could drain the queue before a LINGER 0 close."""
    reached = threading.Event()

    def profile(frame, event, arg):
        if (event == "return" and frame.f_code.co_name == "close"
                and frame.f_globals.get("__name__") == "zmq.sugar.socket"):
            reached.set()

    def close():
        sys.setprofile(profile)
        try:
            pub.close()
        finally:
            sys.setprofile(None)
            reached.set()
    closing = threading.Thread(target=close, daemon=True)
    closing.start()
    return closing, reached


@test(input=f"a SUB in the judge's process (RCVHWM 10) that reads nothing yet; publish "
            f"{DRAIN_MESSAGES} messages of {DRAIN_BYTES} bytes; close(); then the SUB reads",
      timeout=30)
def close_delivers_what_was_published(impl):
    linger_s = getattr(impl, "PUBLISH_LINGER_MS", 1000) / 1000
    messages = [i.to_bytes(4, "big") + bytes(DRAIN_BYTES - 4) for i in range(DRAIN_MESSAGES)]
    with IpcDir() as d:
        ctx = zmq.Context()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, 10)  # the rest waits in the publisher's queue
        pub, closing, got = impl.Publisher(d.path("pub")), None, []
        try:
            sub.connect(d.path("pub"))
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            pub.wait_for_subscribers(1, JOIN_S)
            for m in messages:
                pub.publish(m)
            closing, reached = _close_when_reached(pub)
            reached.wait(scaled(5.0))
            while len(got) < len(messages) and sub.poll(int(QUIET_S * 1000)):
                got.append(sub.recv())
            closing.join(linger_s + scaled(3.0))
        finally:
            if closing is None:
                pub.close()
            sub.close()
            ctx.term()
    if len(got) == len(messages) and got != messages:
        raise Fail("close() right after publishing: the subscriber got every message, but not "
                   "as published (one frame each, in order)")
    if got != messages:
        raise Fail(f"close() right after publishing {len(messages)} messages to a subscriber that "
                   f"reads them: it got {len(got)}. close() drops what is still queued unless "
                   "the socket's linger gives it time to leave: keep LINGER at "
                   "PUBLISH_LINGER_MS (not 0), and close without linger=0 (no destroy(linger=0))",
                   expected=f"{len(messages)} messages, in order", got=f"{len(got)} messages")


@test(input="SUB A subscribes to b''; SUB B subscribes to b'x', then unsubscribes; "
            "wait_for_subscribers(3, 1.0)", timeout=8,
      hang="wait_for_subscribers must give up after its timeout: poll, never a bare recv.")
def wait_is_bounded(impl):
    with IpcDir() as d:
        ctx = zmq.Context()
        pub = impl.Publisher(d.path("pub"))
        subs = [ctx.socket(zmq.SUB) for _ in range(2)]
        try:
            for sub, topic in zip(subs, (b"", b"x")):
                sub.setsockopt(zmq.LINGER, 0)
                sub.connect(d.path("pub"))
                sub.setsockopt(zmq.SUBSCRIBE, topic)
            subs[1].setsockopt(zmq.UNSUBSCRIBE, b"x")
            try:
                seen = pub.wait_for_subscribers(3, 1.0)
            except TimeoutError as e:
                if "1 of 3" in str(e):
                    raise Fail("wait_for_subscribers counted 1 of the 2 subscriptions: a "
                               "subscription to b'x' arrives as b'\\x01x', and counts too. A "
                               "message whose first byte is SUBSCRIBE (1) is a subscription, "
                               "whatever topic follows", expected="... 2 of 3 ...",
                               got=str(e)) from None
                if "2 of 3" not in str(e):
                    raise Fail("the TimeoutError must say how many joined (two subscriptions; "
                               "an unsubscription, first byte 0, is not one)",
                               expected="... 2 of 3 ...", got=str(e)) from None
                return
            raise Fail("wait_for_subscribers(3, 1.0) after two subscriptions and one "
                       "unsubscription must raise TimeoutError: count only messages whose first "
                       "byte is SUBSCRIBE (1)", expected="TimeoutError", got=seen)
        finally:
            for sub in subs:
                sub.close()
            pub.close()
            ctx.term()


def _subscribe_at(ctx, address, times, subs, stop):
    """A SUB socket subscribes to b'' at each of `times` (s from now); they go into `subs`."""
    start = time.monotonic()
    for at in times:
        if stop.wait(max(0.0, start + at - time.monotonic())):
            return
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.connect(address)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        subs.append(sub)


@test(input="SUB sockets subscribe 0.3 s and 0.6 s in; wait_for_subscribers(3, 1.2); a third "
            "subscribes; wait_for_subscribers(3, 2.0) (times stretched on a busy machine)",
      timeout=15)
def waits_count_in_total(impl):
    asked = 1.2 * S
    with IpcDir() as d:
        ctx, subs, stop = zmq.Context(), [], threading.Event()
        pub = impl.Publisher(d.path("pub"))
        joiner = threading.Thread(target=_subscribe_at,
                                  args=(ctx, d.path("pub"), (0.3 * S, 0.6 * S), subs, stop))
        try:
            with PollLog() as polls:
                joiner.start()
                try:
                    pub.wait_for_subscribers(3, asked)
                except TimeoutError:
                    pass
                else:
                    raise Fail("wait_for_subscribers(3) returned with 2 subscribers")
            polls.fail_if_past(asked, f"wait_for_subscribers(3, {asked:.2g})", "subscription")
            joiner.join()
            _subscribe_at(ctx, d.path("pub"), (0,), subs, stop)
            try:
                seen = pub.wait_for_subscribers(3, IN_PROCESS_JOIN_S)
            except TimeoutError as e:
                raise Fail("after 2 subscriptions (seen by the first call) and a third, "
                           "wait_for_subscribers(3) must return: it counts in total, from the "
                           "start, not afresh at each call", got=f"TimeoutError: {e}") from None
            check_equal(seen, 3, "wait_for_subscribers(3) after the third subscription")
            check_equal(pub.wait_for_subscribers(2, IN_PROCESS_JOIN_S), 3,
                        "wait_for_subscribers(2) after 3 subscriptions: the count, not n")
            check_polls_time_left(lambda t: pub.wait_for_subscribers(4, t),
                                  "wait_for_subscribers(4, timeout) with 3 subscribed", JOIN_S)
        finally:
            stop.set()
            joiner.join()
            for sub in subs:
                sub.close()
            pub.close()
            ctx.term()


@test(input="your receive(address, 50, 2.0) in 3 processes; your Publisher; 50 messages, "
            "message 7 binary (bytes 0xff 0x00 0xfe, not UTF-8)", timeout=30)
def your_subscribers(impl):
    messages = [f"update {i}" if i != 7 else "update \xff\x00\xfe" for i in range(50)]
    code = RECEIVE_CODE.format(module=impl.__name__)
    with IpcDir() as d:
        pub = impl.Publisher(d.path("pub"))
        procs = [_start(code, d.path("pub"), len(messages), QUIET_S) for _ in range(3)]
        try:
            try:
                pub.wait_for_subscribers(3, YOUR_JOIN_S)
            except TimeoutError as e:
                raise Fail("your publisher did not see the subscriptions of 3 receive() "
                           f"processes (TimeoutError: {e}): receive() must connect and set "
                           "zmq.SUBSCRIBE to b''") from None
            for m in messages:
                pub.publish(m.encode("latin-1"))  # a message is any bytes
            results = _collect(procs, "your receive() process")
        finally:
            kill_if_alive(*procs)
            pub.close()
        _check_all_received(results, messages, "your receive() process")



@test(input=f"your receive(address, 7, {TRICKLE_IDLE_S:.2g}) in a process; your Publisher "
            f"sends 6 messages, one every {TRICKLE_S:.2g} s, then nothing (and stays open); "
            "first your receive(address, 1, timeout) with no publisher, on a clock that stands "
            "still", timeout=30)
def receive_waits_per_message(impl):
    with IpcDir() as d:  # nobody publishes there: receive's first wait is its whole timeout
        step("receive(address, 1, timeout) with no publisher, on a clock that stands still")
        check_polls_time_left(lambda t: impl.receive(d.path("pub"), 1, t),
                              "receive(address, 1, timeout)", JOIN_S)
    step(f"receive(address, 7, {TRICKLE_IDLE_S:.2g}) in a process, 6 messages "
         f"{TRICKLE_S:.2g} s apart")
    messages = [f"slow {i}" for i in range(6)]
    for _ in range(TRICKLE_ROUNDS):
        got, slowest = _trickle_round(impl, messages)
        if got == messages or slowest < TRICKLE_IDLE_S - TRICKLE_S:
            break  # a verdict: the judge kept its pace (a gap far under the idle timeout)
    else:
        raise Fail(f"the judge could not publish every {TRICKLE_S:.2g} s in {TRICKLE_ROUNDS} "
                   f"rounds (the machine is too busy to tell): run the judge again")
    if got != messages:
        raise Fail(f"receive(address, 7, timeout={TRICKLE_IDLE_S:.2g}) returned {len(got)} of "
                   f"6 messages that came every {TRICKLE_S:.2g} s: `timeout` is how long it "
                   f"waits for the next message, counted from the last one, not a limit on "
                   f"the whole call", expected=messages, got=got)


def _trickle_round(impl, messages):
    """One receive(address, 7) against a trickle of `messages`: what it returned, and the
    longest gap the judge left between two publishes (a stalled judge makes a long one)."""
    with IpcDir() as d:
        pub = impl.Publisher(d.path("pub"))  # asked for one more than it gets: returns the 6
        procs = [_start(RECEIVE_CODE.format(module=impl.__name__), d.path("pub"),
                        len(messages) + 1, TRICKLE_IDLE_S)]
        try:
            pub.wait_for_subscribers(1, YOUR_JOIN_S)
            sent = []
            for m in messages:
                pub.publish(m.encode())
                sent.append(time.monotonic())
                time.sleep(TRICKLE_S)
            # its last message came: it returns TRICKLE_IDLE_S later
            (got,) = _collect(procs, "your receive() process", TRICKLE_IDLE_S + scaled(4.0))
        finally:
            kill_if_alive(*procs)
            pub.close()
    return got, max(b - a for a, b in zip(sent, sent[1:]))


@test(input="your receive(address, 0, 2.0) in a process; the judge's XPUB publishes 3 messages "
            "if its subscription comes before it returns", timeout=30)
def receive_zero_messages(impl):
    with IpcDir() as d:
        ctx = zmq.Context()
        xpub = ctx.socket(zmq.XPUB)
        xpub.setsockopt(zmq.LINGER, 0)
        xpub.bind(d.path("pub"))
        proc = _start(RECEIVE_CODE.format(module=impl.__name__), d.path("pub"), 0, QUIET_S)
        try:
            deadline = time.monotonic() + JOIN_S
            while proc.poll() is None and not xpub.poll(50):  # returned at once, or subscribed
                if time.monotonic() > deadline:
                    raise Fail(f"receive(address, 0, ...) neither returned nor subscribed "
                               f"within {JOIN_S:g} s")
            if proc.poll() is None:
                for i in range(3):
                    xpub.send(f"extra {i}".encode())
            (got,) = _collect([proc], "your receive(address, 0) process")
        finally:
            kill_if_alive(proc)
            xpub.close()
            ctx.term()
        check_equal(got, [], "receive(address, 0, ...): the first 0 messages (check the count "
                    "before waiting for a message)")
