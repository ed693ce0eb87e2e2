"""A warm parent for the judge's test processes: it imports what an exercise's tests import
(torch takes about 2 s of CPU a process), then forks one child per test.

    python -m minivllm.judge.zygote TESTS_PY

The judge sends a request over the socket on fd 0: one JSON line (argv, env, cwd for
minivllm.judge.child) with two fds, the output pipe and the verdict pipe. The zygote forks;
the child starts its own session, takes the fds, the environment and the folder, and runs the
test as `python -m minivllm.judge.child` would. The zygote answers {"pid": ...}, then
{"exit": code} once the child is reaped (code as subprocess reports it: -N for signal N).
When the judge's end closes while a test runs, the zygote kills the test's session and exits.
Nothing of the tests or the learner's module is kept: the child loads both afresh.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time

MAX_FDS = 2  # the output pipe and the verdict pipe
REQUEST_BYTES = 1 << 20  # argv, env and cwd of one test


def warm_up(tests_path: str) -> list[dict]:
    """Import what the tests import, and list the tests; their module itself is dropped (each
    child loads it afresh). [] when it does not load (the judge loads it to report why)."""
    from minivllm.judge.child import load_tests
    try:
        _, specs = load_tests(tests_path)
    except BaseException:
        return []
    return [{"name": s.name, "input": s.input, "timeout": s.timeout, "hang": s.hang,
             "requires": list(s.requires)} for s in specs]


def serve(sock: socket.socket) -> None:
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(sock, REQUEST_BYTES, MAX_FDS)
        except (ConnectionError, OSError):
            return
        if not data:
            return
        request = json.loads(data)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(sock, fds, request)  # never returns
        for fd in fds:
            os.close(fd)
        sock.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        status = _wait_or_judge_gone(sock, pid)
        if status is None:
            return
        sock.sendall(json.dumps({"exit": os.waitstatus_to_exitcode(status)}).encode() + b"\n")


def _wait_or_judge_gone(sock: socket.socket, pid: int) -> int | None:
    """The child's wait status; None when the judge went away first (killed, or stopped by a
    signal between asking for this fork and learning its pid): the child's session is killed,
    so a test never outlives the judge that ran it."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    child = os.pidfd_open(pid)
    poller.register(child, select.POLLIN)
    try:
        while True:
            ready = dict(poller.poll())
            if child in ready:
                return os.waitpid(pid, 0)[1]
            if sock.fileno() in ready:
                if sock.recv(1, socket.MSG_PEEK):  # not a request the judge would send now
                    poller.unregister(sock)
                    continue
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)  # its own session: pgid == pid
                os.waitpid(pid, 0)
                return None
    finally:
        os.close(child)


def _child(sock: socket.socket, fds: list[int], request: dict) -> None:
    code = 1
    try:
        sock.close()
        os.setsid()
        out, verdict = fds
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(null)
        os.close(out)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        tempfile.tempdir = None  # the TMPDIR just set
        from minivllm.judge import child
        sys.argv = [child.__file__, *request["argv"]]
        sys.stdout.reconfigure(line_buffering=True)
        code = child.serve(verdict, request["argv"])
    except BaseException:
        import traceback
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


class ForkedTest:
    """The judge's handle on a test process forked by a Zygote: pid, wait, returncode."""

    def __init__(self, zygote: "Zygote", pid: int):
        self.zygote, self.pid, self.returncode = zygote, pid, None

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            reply = self.zygote.reply(timeout)
            if reply is None:
                raise subprocess.TimeoutExpired("test", timeout)
            self.returncode = reply.get("exit", -9)
        return self.returncode


class Zygote:
    """One per grade: the judge's side of the socket, and the zygote's process."""

    def __init__(self, tests_path: str, env: dict[str, str]):
        # SEQPACKET: a request (and its fds) arrives whole in one recv
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.proc = subprocess.Popen([sys.executable, "-m", "minivllm.judge.zygote", tests_path],
                                     stdin=theirs, env=env, start_new_session=True)
        theirs.close()
        self.buf = b""

    def specs(self) -> list[dict]:
        """The tests, as the zygote loaded them; [] when it could not."""
        return (self.reply(None) or {}).get("specs") or []

    def fork(self, argv: list[str], env: dict[str, str], cwd: str,
             fds: list[int]) -> ForkedTest | None:
        """The test's process, or None when the zygote is gone (the caller starts one itself)."""
        try:
            socket.send_fds(self.sock, [json.dumps({"argv": argv, "env": env, "cwd": cwd})
                                        .encode()], fds)
            reply = self.reply(None)
        except OSError:
            reply = None
        return ForkedTest(self, reply["pid"]) if reply and "pid" in reply else None

    def reply(self, timeout: float | None) -> dict | None:
        """The next line from the zygote; None at the timeout; {} when it is gone."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(4096)
            except TimeoutError:
                return None
            if not chunk:
                return {}
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def close(self) -> None:
        self.sock.close()  # the zygote reads EOF and exits
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def main(argv: list[str]) -> int:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET, fileno=os.dup(0))
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sock.sendall(json.dumps({"specs": warm_up(argv[0])}).encode() + b"\n")
    serve(sock)
    sys.stdout.flush()
    os._exit(0)  # tearing down torch's modules takes seconds and changes nothing


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
