"""Which call of the learner's a test was in when its time limit ended.

The test's process registers faulthandler on STACK_SIGNAL, writing to its verdict pipe (child.py).
At the limit, before it kills the test, the judge sends that signal and reads the Python stacks
of every thread: in the thread that runs the test (one with a frame of tests.py), the outermost
frame of the learner's file is the call that hung, named on the failure's `input:` line.
"""

from __future__ import annotations

import os
import re
import signal
import time

STACK_SIGNAL = signal.SIGUSR2
DUMP_WAIT_S = 1.0  # faulthandler writes from its signal handler: at once, even with the GIL held
_FRAME = re.compile(rb'^\s*File "(.+)", line (\d+) in (\S+)', re.M)
_THREAD = re.compile(rb"\n(?=(?:Current thread|Thread) 0x)")


def ask_for_stacks(pid: int, tail) -> bytes:
    """Signal the test process and return what it wrote to the verdict pipe (a _Tail that keeps
    reading) in answer: faulthandler's dump, once it stops growing."""
    before = len(tail.data)
    try:
        os.kill(pid, STACK_SIGNAL)
    except ProcessLookupError:
        return b""
    deadline, seen = time.monotonic() + DUMP_WAIT_S, -1
    while time.monotonic() < deadline and not (seen == len(tail.data) > before):
        seen = len(tail.data)
        time.sleep(0.05)
    return tail.data[before:]


def hung_call(dump: bytes, learner_file: str, tests_file: str) -> str:
    """'name() (at line N of your file ...)' for the outermost learner frame above the test's
    own frames in the thread that runs the test; '' if the test was not in the learner's code."""
    learner, tests = learner_file.encode(), tests_file.encode()
    for block in _THREAD.split(dump):
        frames = _FRAME.findall(block)  # the most recent call first
        files = [f for f, _, _ in frames]
        if tests not in files:
            continue
        mine = [(line, name) for f, line, name in frames[:files.index(tests)] if f == learner]
        if mine:
            line, name = mine[-1]
            return (f"{name.decode()}(...), still running at line {line.decode()} of your file "
                    "when the judge stopped the test")
    return ""
