"""Send the log of child processes to a file, then read back one line per failure.

A drill that kills a process on purpose makes its peers print long tracebacks (a worker's gloo
"Connection reset by peer", the engine core's WorkerDiedError). A notebook shows them in full.
Children inherit file descriptor 2 when they start, so pointing it at a file while they start,
and back afterwards, sends their log there and leaves this process's own stderr alone:

    with stderr_to(path):
        llm = LLM(tensor_parallel_size=3)      # the engine core and its workers log to path
    ...                                        # the drill
    for line in failures(path):
        print(line)
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Iterator

# The last line of a Python traceback: a (dotted) exception class, a colon, the message.
EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt)): (.*)$")
LINE_CHARS = 160  # one screen line per failure; the log file keeps the rest


@contextlib.contextmanager
def stderr_to(path: str) -> Iterator[None]:
    """Point fd 2 at `path` (appending) for the block; processes started inside inherit it."""
    sys.stderr.flush()
    saved = os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.dup2(fd, 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(fd)


def failures(path: str) -> list[str]:
    """Each distinct exception the log reports, once, in order, cut to one line."""
    seen: dict[str, None] = {}
    with open(path, errors="replace") as f:
        for line in f:
            match = EXCEPTION_LINE.match(line.rstrip())
            if match:
                kind, message = match.groups()
                seen.setdefault(f"{kind.rsplit('.', 1)[-1]}: {message}"[:LINE_CHARS], None)
    return list(seen)
