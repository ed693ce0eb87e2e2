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
    which entered the `with` makes (the learner's code, not the judge's helper threads)."""

    def __enter__(self) -> "PollLog":
        self.calls: list[tuple[float, int | None]] = []
        self.real = (zmq.Socket.poll, zmq.Poller.poll)
        (socket_poll, poller_poll), me = self.real, threading.current_thread()

        def log(timeout):
            if threading.current_thread() is me:
                self.calls.append((time.monotonic(), timeout))

        def sock_poll(sock, timeout=None, flags=zmq.POLLIN):
            log(timeout)
            return socket_poll(sock, timeout, flags)

        def poller(p, timeout=None):
            log(timeout)
            return poller_poll(p, timeout)
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
