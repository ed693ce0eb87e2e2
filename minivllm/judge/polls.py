"""Which waits a learner's zmq code made, for tests of "the timeout is for the whole call".

A test that lets messages trickle in cannot tell a total deadline from one that restarts at
every message by the clock alone without deciding by speed. PollLog records, instead, when each
zmq poll was called and with what timeout: a poll that could end past the deadline asked for is
the bug, whatever the machine's load.
"""

from __future__ import annotations

import threading
import time

import zmq

POLL_SLACK_S = 0.3  # a poll may end this far past the deadline: a stall between clock and call
# (stretched by api.scaled; a test stretches its trickle by the same factor, so that a timeout
# that restarts at every message overshoots by more than the slack at any load)


class PollLog:
    """Records (when, timeout in ms) of every zmq Socket.poll and Poller.poll that the thread
    which entered the `with` makes (the learner's code, not the judge's helper threads), and
    in `found` whether each found something ready."""

    def __enter__(self) -> "PollLog":
        self.calls: list[tuple[float, int | None]] = []
        self.found: list[bool] = []
        self.real = (zmq.Socket.poll, zmq.Poller.poll)
        (socket_poll, poller_poll), me = self.real, threading.current_thread()

        def log(timeout):
            if threading.current_thread() is me:
                self.calls.append((time.monotonic(), timeout))

        def sock_poll(sock, timeout=None, flags=zmq.POLLIN):
            log(timeout)
            return returned(socket_poll(sock, timeout, flags))

        def poller(p, timeout=None):
            log(timeout)
            return returned(poller_poll(p, timeout))

        def returned(ready):
            if threading.current_thread() is me:
                self.found.append(bool(ready))
            return ready
        zmq.Socket.poll, zmq.Poller.poll = sock_poll, poller
        self.started = time.monotonic()
        return self

    def __exit__(self, *exc) -> None:
        zmq.Socket.poll, zmq.Poller.poll = self.real

    def past(self, asked: float) -> list[tuple[float, float | None]]:
        """The polls, as (s since the `with`, timeout in s), that could end past `asked` s
        after the `with` began."""
        from minivllm.judge.api import scaled
        started, slack = self.started, scaled(POLL_SLACK_S)
        return [(round(t - started, 2), None if ms is None else ms / 1000) for t, ms in self.calls
                if ms is None or ms < 0 or t + ms / 1000 > started + asked + slack]

    def fail_if_past(self, asked: float, call: str, unit: str) -> None:
        """Fail when a poll of `call` (its timeout `asked`, s) could end past its deadline."""
        from minivllm.judge.api import Fail
        late = self.past(asked)
        if late:
            raise Fail(f"{call} polled past its deadline: its timeout restarts at every {unit}, "
                       f"so {unit}s that trickle in stretch it without end. `timeout` is for the "
                       f"whole call", got=f"(s since the call, poll timeout in s): {late[:4]}")


class _Polled(BaseException):
    """Ends a call at its first poll: the test wants only the timeout it asked for."""


def first_poll(call, timeout: float, limit: float) -> tuple[bool, int | float | None]:
    """call(timeout) in a thread while time.monotonic stands still (a fake clock: the time left
    is the whole timeout); its first zmq poll records its timeout (ms) and ends the call.
    (whether it polled, that timeout); Fail if it neither polled nor returned within `limit`."""
    from minivllm.judge.api import Fail
    from minivllm.judge.bounded import call_bounded
    real, frozen, polls, me = (time.monotonic, zmq.Socket.poll, zmq.Poller.poll), \
        time.monotonic(), [], []

    def poll(obj, ms=None, *args, **kwargs):
        if threading.get_ident() in me:
            polls.append(ms)
            raise _Polled
        return (real[1] if isinstance(obj, zmq.Socket) else real[2])(obj, ms, *args, **kwargs)

    def run(t):
        me.append(threading.get_ident())
        return call(t)
    time.monotonic, zmq.Socket.poll, zmq.Poller.poll = (lambda: frozen), poll, poll
    try:
        thread, out = call_bounded(run, timeout, limit=limit)
    finally:
        time.monotonic, zmq.Socket.poll, zmq.Poller.poll = real
    if thread.is_alive():
        raise Fail(f"a call with timeout={timeout:g} on a clock that stood still neither polled "
                   f"nor returned within {limit:g} s: every wait polls with the time left")
    error = out.get("error")
    if error is not None and not isinstance(error, (_Polled, TimeoutError)):
        raise error
    return bool(polls), polls[0] if polls else None


def check_polls_time_left(call, what: str, limit: float,
                          timeouts: tuple[float, ...] = (2.0, 0.0005, 0.0)) -> None:
    """call(timeout) for each timeout, on a clock that stands still: its first poll may wait
    the time left rounded up to a whole millisecond (poll takes ms), never more; Fail naming
    `what` otherwise. Tells a poll 0.1% or 1 ms past the deadline apart without timing it."""
    import math
    from minivllm.judge.api import Fail
    for timeout in timeouts:
        polled, ms = first_poll(call, timeout, limit)
        most = math.ceil(timeout * 1000)
        if polled and (ms is None or ms < 0 or ms > most):
            raise Fail(f"{what} with timeout={timeout:g} s polled for {ms} ms with "
                       f"{timeout * 1000:g} ms left (the clock stood still): the README has "
                       "every wait poll with the time left, in whole milliseconds, so it may "
                       f"round up to {most} ms but never wait past the deadline",
                       expected=f"poll(<= {most})", got=f"poll({ms})")
