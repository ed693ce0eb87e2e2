"""The judge's tests for exercise 123. Each receives the learner's module as `impl`.

Every pipe and process is real. The switch counts are checked where the test makes them
deterministic: a process seen blocked in a read N times has at least N voluntary switches, and
a writer whose reader drains the pipe only once it is full blocks about once per pipe-full.
"""

from __future__ import annotations

import array
import errno
import fcntl
import inspect
import os
import select
import subprocess
import sys
import tempfile
import termios
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from minivllm.judge import procfs
from minivllm.judge.api import Fail, check_equal, scaled, step, test

F_SETPIPE_SZ, F_GETPIPE_SZ = 1031, 1032
KIB, MIB = 1 << 10, 1 << 20
SLOW_DEATH_S = 0.2  # how long a SIGKILLed writer takes to die in finish_reports_errors
WAIT_S = scaled(10.0)  # a pipe not filled (or a child not answering) in this long never will
HANG_S = scaled(4.0)  # past its deadline, a call that should return (or an EOF due) is hung
S = scaled(1.0)  # the trickle stretches with the judge's time limits, and the slack with it
TRICKLE_S = 0.25 * S  # a stopped writer is let run this often, for 2 ms
SELECT_SLACK_S = 0.5 * S  # a select may end this far past the deadline (a stall before the call)
BLOCKS = 100  # reads the judge sees blocked (state S) before it lets them go: each is a switch


def _real_max() -> int:
    with open("/proc/sys/fs/pipe-max-size") as f:
        return int(f.read())


def _size(fd: int) -> int:
    return fcntl.fcntl(fd, F_GETPIPE_SZ)


def _waiting(fd: int) -> int:
    n = array.array("i", [0])
    fcntl.ioctl(fd, termios.FIONREAD, n)
    return n[0]


def _pattern(start: int, n: int) -> bytes:
    head = start % 256
    return (bytes(range(256)) * ((head + n) // 256 + 1))[head:head + n]


@test(input="pipe_max_size() on the real file; on files holding '4194304\\n', 'lots', and none")
def max_size_file(impl):
    step("pipe_max_size() on the real file")
    check_equal(impl.pipe_max_size(), _real_max(), "pipe_max_size() (/proc/sys/fs/pipe-max-size)")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "pipe-max-size")
        with open(path, "w") as f:
            f.write("4194304\n")
        step("pipe_max_size(a file holding '4194304\\n')")
        check_equal(impl.pipe_max_size(path), 4194304, "pipe_max_size(a file holding '4194304\\n')")
        with open(path, "w") as f:
            f.write("lots\n")
        step("pipe_max_size(a file holding 'lots')")
        try:
            got = impl.pipe_max_size(path)
        except ValueError as e:
            if path not in str(e):
                raise Fail("the ValueError must name the file it could not read",
                           expected=f"... {path} ...", got=str(e))
        else:
            raise Fail("pipe_max_size of a file holding 'lots' must raise ValueError", got=got)
        step("pipe_max_size(a missing file)")
        try:
            got = impl.pipe_max_size(os.path.join(d, "missing"))
        except FileNotFoundError:
            return
        raise Fail("pipe_max_size of a missing file must raise FileNotFoundError", got=got)


@test(input="a fresh pipe (64 KiB): grow_pipe to 256 KiB, 100000, 4096, 1; want 0 and -1; "
            "a regular file")
def grows_and_rounds(impl):
    step("grow_pipe(w, 256 KiB), then grow_pipe(w, 100000), on a fresh 64 KiB pipe")
    r, w = os.pipe()
    try:
        check_equal(impl.grow_pipe(w, 256 * KIB), 256 * KIB, "grow_pipe(w, 256 KiB)")
        check_equal(_size(r), 256 * KIB, "F_GETPIPE_SZ after grow_pipe(w, 256 KiB)")
        check_equal(impl.grow_pipe(w, 100000), 256 * KIB,
                    "grow_pipe(w, 100000) on a 256 KiB pipe (it never shrinks a pipe)")
    finally:
        os.close(r)
        os.close(w)
    step("grow_pipe(r, 100000), then 4096, 1, 0 and -1, on a fresh 64 KiB pipe")
    r, w = os.pipe()
    try:
        check_equal(impl.grow_pipe(r, 100000), 128 * KIB,
                    "grow_pipe(r, 100000) on a 64 KiB pipe: the kernel rounds up to a power of two "
                    "pages, and F_SETPIPE_SZ returns the size it set")
        check_equal(impl.grow_pipe(w, 4096), 128 * KIB,
                    "grow_pipe(w, 4096) (it never shrinks a pipe)")
        check_equal(_size(w), 128 * KIB, "F_GETPIPE_SZ after grow_pipe(w, 4096)")
        try:
            check_equal(impl.grow_pipe(w, 1), 128 * KIB, "grow_pipe(w, 1): the smallest size "
                        "there is, so the pipe keeps its own")
        except ValueError as e:
            raise Fail(f"grow_pipe(w, 1) raised ValueError ({e}): only want <= 0 is refused, "
                       "and 1 is a size (check the comparison in your guard)") from None
        for bad in (0, -1):
            try:
                got = impl.grow_pipe(w, bad)
            except ValueError:
                continue
            raise Fail(f"grow_pipe(w, {bad}) must raise ValueError", got=got)
    finally:
        os.close(r)
        os.close(w)
    step("grow_pipe(a regular file's fd, 1 MiB)")
    with tempfile.TemporaryFile() as f:
        try:
            got = impl.grow_pipe(f.fileno(), MIB)
        except OSError as e:
            if isinstance(e, PermissionError):
                raise Fail("grow_pipe on a regular file must let the kernel's EBADF through, "
                           "not turn it into something else", got=repr(e))
            return
        raise Fail("grow_pipe on a regular file (not a pipe) must raise the kernel's OSError "
                   "(EBADF): only EPERM means 'try a smaller size'", got=got)


def _privileged(max_size: int) -> bool:
    """Whether this process may exceed pipe-max-size (CAP_SYS_RESOURCE): then no EPERM comes."""
    r, w = os.pipe()
    try:
        fcntl.fcntl(w, F_SETPIPE_SZ, 2 * max_size)
        return True
    except PermissionError:
        return False
    finally:
        os.close(r)
        os.close(w)


def _eperm_cases(impl, max_size: int) -> list[tuple[str, int, int, int]]:
    """(case, want, what grow_pipe returned, F_GETPIPE_SZ after)."""
    out = []
    for want in (8 * max_size, 3 * max_size + 5, max_size):
        r, w = os.pipe()
        try:
            try:
                got = impl.grow_pipe(w, want)
            except PermissionError as e:  # the kernel's EPERM let out: named by the check
                got = f"raised {e!r}"
            out.append((f"grow_pipe(w, {want})", want, got, _size(r)))
        finally:
            os.close(r)
            os.close(w)
    return out


def _run_unprivileged(impl, max_size: int):
    """Run the EPERM cases in a forked child that dropped root (and so CAP_SYS_RESOURCE)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(r)
            os.setgid(65534)
            os.setuid(65534)
            os.write(w, repr(_eperm_cases(impl, max_size)).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    if not data:
        raise Fail("grow_pipe crashed in the unprivileged child (run it as a normal user to see)")
    return eval(data.decode())


BUDGET = 256 * KIB  # the largest pipe a user whose page budget is nearly spent may get


class _PageBudget:
    """While active, fcntl.fcntl refuses (EPERM) to grow a pipe past BUDGET, as the kernel does
    once the user holds more than pipe-user-pages-soft pages of pipes, however far below
    pipe-max-size (or, given `errno`, fails so); `calls` counts the refusals."""

    def __init__(self, error: int = errno.EPERM):
        self.real, self.calls, self.error = fcntl.fcntl, 0, error

    def fcntl(self, fd, cmd, arg=0):
        if cmd == F_SETPIPE_SZ and arg > BUDGET:
            self.calls += 1
            raise OSError(self.error, os.strerror(self.error))  # EPERM: a PermissionError
        return self.real(fd, cmd, arg)

    def __enter__(self):
        fcntl.fcntl = self.fcntl
        return self

    def __exit__(self, *exc):
        fcntl.fcntl = self.real


@test(input="as an unprivileged process: grow_pipe(w, want) for want = 8*max, 3*max+5, max "
            "(max = /proc/sys/fs/pipe-max-size); then grow_pipe(w, max) where the page budget "
            "refuses more than 256 KiB")
def halves_on_eperm(impl):
    max_size = _real_max()
    if not _privileged(max_size):
        cases = _eperm_cases(impl, max_size)
    elif os.geteuid() == 0:
        cases = _run_unprivileged(impl, max_size)
    else:
        raise Fail("this machine lets a non-root process exceed pipe-max-size: cannot test EPERM")
    for case, want, got, size in cases:
        check_equal(got, max_size, f"{case}: the kernel refuses (EPERM) above pipe-max-size, so "
                                   "halve the request until it is accepted", input=case)
        check_equal(size, max_size, f"F_GETPIPE_SZ after {case}", input=case)
    step(f"grow_pipe(w, {max_size}) with the page budget refusing more than 256 KiB (EPERM), "
         "then failing ENOMEM instead")
    r, w = os.pipe()
    try:
        with _PageBudget() as budget:
            try:
                got = impl.grow_pipe(w, max_size)
            except PermissionError as e:
                got = repr(e)
        if budget.calls:  # else the learner calls fcntl some other way: nothing to refuse
            check_equal(got, BUDGET, "grow_pipe(w, max) when the user's page budget "
                        "(pipe-user-pages-soft) refuses anything above 256 KiB: EPERM comes "
                        "below pipe-max-size too, so halve the request, do not ask for the max",
                        input=f"grow_pipe(w, {max_size}), EPERM above {BUDGET}")
        with _PageBudget(errno.ENOMEM) as budget:  # not EPERM: the caller's to handle
            try:
                got = f"returned {impl.grow_pipe(w, max_size)}"
            except OSError as e:
                got = e
        if budget.calls and getattr(got, "errno", None) != errno.ENOMEM:
            raise Fail("grow_pipe must let an OSError other than EPERM through: only EPERM "
                       "means 'ask for less'", expected="OSError ENOMEM", got=repr(got),
                       input=f"grow_pipe(w, {max_size}), ENOMEM above {BUDGET}")
    finally:
        os.close(r)
        os.close(w)


def _blocker():
    """A child that, BLOCKS times, says b"r" and then blocks reading one byte from stdin."""
    code = ("import os\n"
            f"for _ in range({BLOCKS}): os.write(1, b'r'); os.read(0, 1)\n"
            "os.write(1, b'x'); os.read(0, 1)\n")
    return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, bufsize=0)


def _wake_when_asleep(stat: str, write_fd: int, what: str) -> None:
    """Write one byte to write_fd once the thread whose /proc stat file is `stat` is seen
    asleep (S): it is blocked in its read, so that read was one voluntary switch."""
    deadline = time.monotonic() + WAIT_S
    while procfs.stat_state(stat) != "S":
        if time.monotonic() > deadline:
            raise Fail(f"{what} was never seen blocked in its read")  # the machine is stuck
        time.sleep(0.0002)
    os.write(write_fd, b"g")


# A child with nonvoluntary switches for sure: pinned to one CPU with a rival that spins there,
# it yields until it has been switched out 20 times while runnable; then it blocks in a read.
PREEMPTED = ("import os\n"
             "os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\n"
             "def nonvoluntary():\n"
             "    with open('/proc/self/status') as f:\n"
             "        return int(next(l for l in f if l.startswith('nonvoluntary_ctxt')).split()[1])\n"
             "rival = os.fork()\n"
             "if rival == 0:\n"
             "    while True: os.sched_yield()\n"
             "while nonvoluntary() < 20: os.sched_yield()\n"
             "os.kill(rival, 9); os.waitpid(rival, 0)\n"
             "os.write(1, b'r'); os.read(0, 1)\n")


def _status_counts(pid: int) -> tuple[int, int]:
    """(voluntary, nonvoluntary) switches of pid, read by the judge."""
    with open(f"/proc/{pid}/status") as f:
        fields = dict(line.split(":", 1) for line in f if ":" in line)
    return int(fields["voluntary_ctxt_switches"]), int(fields["nonvoluntary_ctxt_switches"])


def _only_the_voluntary_line(impl) -> None:
    """voluntary_switches of a blocked child with nonvoluntary switches is its voluntary line."""
    proc = subprocess.Popen([sys.executable, "-c", PREEMPTED], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, bufsize=0)
    try:
        if proc.stdout.read(1) != b"r":
            raise Fail("the probe child died")  # the machine is broken
        deadline = time.monotonic() + WAIT_S
        while procfs.process_state(proc.pid) != "S":  # blocked in its read: the counts hold still
            if time.monotonic() > deadline:
                raise Fail("the probe child was never seen blocked in its read")
            time.sleep(0.001)
        counts = _status_counts(proc.pid)
        got = impl.voluntary_switches(proc.pid)
        if got != counts[0]:
            raise Fail("voluntary_switches(pid) is the number on the 'voluntary_ctxt_switches:' "
                       f"line alone; this child has {counts[0]} voluntary and {counts[1]} "
                       "nonvoluntary switches. Adding up every line that contains "
                       "'voluntary_ctxt_switches:' counts the nonvoluntary line too: match with "
                       "line.startswith", expected=counts[0], got=got)
    finally:
        proc.stdin.close()
        proc.wait()
        proc.stdout.close()


@test(input=f"a child seen blocked in a pipe read {BLOCKS} times; a blocked child with "
            f"nonvoluntary switches; this process, blocked in a pipe read {BLOCKS} times; a reaped "
            "child", timeout=30)
def counts_voluntary_switches(impl):
    step(f"voluntary_switches(pid) of a child seen blocked in a read {BLOCKS} times")
    proc = _blocker()
    try:
        for _ in range(BLOCKS):
            if proc.stdout.read(1) != b"r":
                raise Fail("the probe child died")  # the machine is broken
            _wake_when_asleep(f"/proc/{proc.pid}/stat", proc.stdin.fileno(), "the probe child")
        proc.stdout.read(1)
        got = impl.voluntary_switches(proc.pid)
        if not isinstance(got, int) or got < BLOCKS:
            raise Fail(f"voluntary_switches(pid) of a child that the judge saw blocked in a read "
                       f"{BLOCKS} times: each is a voluntary switch, so at least that many (the "
                       "line is 'voluntary_ctxt_switches:', not 'nonvoluntary_ctxt_switches:')",
                       expected=f">= {BLOCKS}", got=got)
    finally:
        proc.stdin.close()
        proc.wait()
        proc.stdout.close()
    step("voluntary_switches(pid) of a blocked child with nonvoluntary switches")
    _only_the_voluntary_line(impl)
    step(f"voluntary_switches(os.getpid()) before and after {BLOCKS} blocked reads")
    r, w = os.pipe()
    me = f"/proc/self/task/{os.getpid()}/stat"
    try:
        before = impl.voluntary_switches(os.getpid())
        with ThreadPoolExecutor(1) as pool:
            for _ in range(BLOCKS):
                waker = pool.submit(_wake_when_asleep, me, w, "this process")
                os.read(r, 1)
                waker.result()
        delta = impl.voluntary_switches(os.getpid()) - before
    finally:
        os.close(r)
        os.close(w)
    if delta < BLOCKS:
        raise Fail(f"voluntary_switches(os.getpid()) must grow by at least {BLOCKS} over "
                   f"{BLOCKS} reads that the judge saw blocked", expected=f">= {BLOCKS}", got=delta)
    step("voluntary_switches(pid) of a child that exited and was reaped")
    try:
        got = impl.voluntary_switches(proc.pid)
    except ProcessLookupError:
        return
    raise Fail("voluntary_switches of a process that is gone must raise ProcessLookupError",
               got=got, input=f"pid {proc.pid}, exited and reaped")


def _slow_read(impl, total: int, pipe_size: int) -> tuple[int, int]:
    """Drain a Writer only when its pipe is full and the writer is seen asleep waiting for room;
    (the writer's switches, the times it was seen asleep: each is a voluntary switch)."""
    writer = impl.Writer(total, pipe_size)
    try:
        check_equal(writer.pipe_size, pipe_size, f"Writer({total}, {pipe_size}).pipe_size")
        check_equal(_size(writer.read_fd), pipe_size,
                    f"F_GETPIPE_SZ of Writer({total}, {pipe_size}).read_fd")
        got, asleep = 0, 0
        while got < total:
            want = min(pipe_size, total - got)
            more = got + want < total  # the writer still has bytes: it must wait for room
            deadline = time.monotonic() + WAIT_S
            while (_waiting(writer.read_fd) < want
                   or (more and procfs.process_state(writer.pid) != "S")):
                if time.monotonic() > deadline:
                    state = procfs.process_state(writer.pid)
                    raise Fail(f"the pipe held {_waiting(writer.read_fd)} bytes after {got} were "
                               f"read (the writer in state {state}), and no more "
                               f"came within {WAIT_S:g} s", expected=f"{want} bytes waiting",
                               got=_waiting(writer.read_fd))
                time.sleep(0.0005)
            asleep += more
            data = b""
            while len(data) < want:
                data += os.read(writer.read_fd, want - len(data))
            if data != _pattern(got, want):
                raise Fail(f"bytes {got}..{got + want} are not the pattern (byte i is i % 256)")
            got += want
        if not select.select([writer.read_fd], [], [], HANG_S)[0] or os.read(writer.read_fd, 1):
            raise Fail(f"after all {total} bytes the reader saw no EOF within {HANG_S:g} s: a "
                       "write end is still open somewhere (close it in the parent after fork, and in "
                       "the child once it has written everything)")
    except BaseException:
        writer.kill()
        raise
    return writer.finish(), asleep


@test(input="Writer(4 MiB, 64 KiB) and Writer(4 MiB, 1 MiB), drained only when the pipe is full "
            "and the writer asleep", timeout=40)
def writer_blocks_when_full(impl):
    for pipe_size in (64 * KIB, min(MIB, _real_max())):
        switches, asleep = _slow_read(impl, 4 * MIB, pipe_size)
        low, high = asleep, 2 * asleep + 30
        if not isinstance(switches, int) or not low <= switches <= high:
            raise Fail(f"Writer.finish() after the judge saw the writer asleep on a full "
                       f"{pipe_size // KIB} KiB pipe {asleep} times: each is a voluntary switch, "
                       "and there are few others, so its voluntary switches (wait4's "
                       "rusage.ru_nvcsw of that child alone) are about that",
                       expected=f"{low} .. {high}", got=switches,
                       input=f"Writer(4 MiB, {pipe_size // KIB} KiB)")


def _nothing_left(fds: int, when: str, process_left: str) -> None:
    """Fail if this process has a child (running or unreaped) or more fds than `fds`."""
    try:
        os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
        pass
    else:
        raise Fail(f"{when}: {process_left}")
    left = procfs.fd_count() - fds
    if left:
        raise Fail(f"{when}: transfer() left {left} file descriptors open: close both pipe ends",
                   expected=0, got=left)


@test(input="transfer(8 MiB, 64 KiB), transfer(3 MiB + 123, 1 MiB), transfer(1 MiB, 100000), "
            "transfer(1 MiB, 1 MiB) with a reader put to sleep 20 times a read, transfer(1, 64 KiB), "
            "transfer(0, 64 KiB), transfer(1 MiB, 0)",
      timeout=40)
def transfer_end_to_end(impl):
    for fn, default in ((impl.Writer.finish, 10.0), (impl.transfer, 30.0)):
        check_equal(inspect.signature(fn).parameters["timeout"].default, default,
                    f"the default timeout of {fn.__qualname__} (the README fixes the signature)")
    fds = procfs.fd_count()
    for total, pipe_size, size in ((8 * MIB, 64 * KIB, 64 * KIB),
                                   (3 * MIB + 123, min(MIB, _real_max()), min(MIB, _real_max())),
                                   (MIB, 100000, 128 * KIB)):  # the kernel rounds 100000 up
        step(f"transfer({total}, {pipe_size})")
        t = impl.transfer(total, pipe_size)
        what = f"transfer({total}, {pipe_size})"
        check_equal((t.bytes, t.pipe_size), (total, size), f"{what}: (bytes, pipe_size: the size "
                    "the pipe got, as grow_pipe returned it)")
        if min(t.writer_switches, t.reader_switches) < 0:
            raise Fail(f"{what}: switch counts are never negative",
                       got=(t.writer_switches, t.reader_switches))
        expected = (t.writer_switches + t.reader_switches) / (total / MIB)
        if abs(t.switches_per_mib - expected) > 1e-9:
            raise Fail(f"{what}: switches_per_mib is (writer + reader) switches per MiB moved",
                       expected=expected, got=t.switches_per_mib)
    for _ in range(200):  # this process has switched far more before the transfer than in it
        time.sleep(0.0001)
    before = _status_counts(os.getpid())[0]
    step("transfer(1 MiB, 1 MiB) with a reader put to sleep 20 times a read")
    with _BadRead(MIB, naps=20) as naps:  # the reader sleeps 20 times a read: 20 switches
        t = impl.transfer(MIB, MIB)
    during = _status_counts(os.getpid())[0] - before
    if t.reader_switches > during:
        raise Fail(f"transfer(1 MiB, 1 MiB): reader_switches is {t.reader_switches}, more than the "
                   f"{during} voluntary switches this process made during the whole transfer() "
                   "call: count them around the read loop (after minus before), not since the "
                   "process started", expected=f"<= {during}", got=t.reader_switches)
    if t.reader_switches < naps.slept // 2:  # the writer, never blocked, has a few
        raise Fail(f"transfer(1 MiB, 1 MiB) whose reader the judge put to sleep {naps.slept} "
                   "times: reader_switches counts this process's voluntary switches around the "
                   "read loop", expected=f">= {naps.slept // 2}", got=t.reader_switches)
    _nothing_left(fds, "after transfer() returned", "a writer process is still running or "
                  "unreaped")
    step("transfer(1, 64 KiB)")
    try:
        check_equal(impl.transfer(1, 64 * KIB).bytes, 1, "transfer(1, 64 KiB).bytes")
    except ValueError as e:
        raise Fail(f"transfer(1, 64 KiB) raised ValueError ({e}): one byte is a transfer, only "
                   "total <= 0 is refused (check the comparison in your guard)") from None
    _refused(impl, fds)


def _refused(impl, fds: int) -> None:
    """transfer(0, ...) and a pipe size grow_pipe refuses: ValueError, and no fd left behind."""
    for total, pipe_size, why in ((0, 64 * KIB, "there is no 'per MiB' of nothing"),
                                  (MIB, 0, "grow_pipe refuses the pipe size 0")):
        step(f"transfer({total}, {pipe_size})")
        try:
            got = impl.transfer(total, pipe_size)
        except ValueError:
            _nothing_left(fds, f"after transfer({total}, {pipe_size}) raised ValueError",
                          "a writer process was started")
            continue
        except Exception as e:
            got = f"{type(e).__name__}: {e}"
            if total:
                got += " (when grow_pipe raises in Writer(), close both pipe ends, then re-raise)"
        raise Fail(f"transfer({total}, {pipe_size}) must raise ValueError ({why})", got=got)


class _BadRead:
    """While active, os.read in this thread returns the bytes of a transfer with the byte at
    offset `flip` changed, or, with `short`, ends them one byte early (an EOF after total - 1):
    what a broken writer would send. With `naps`, each read first sleeps `naps` times, counted
    in `slept`: each is a voluntary switch of this thread (unless it was preempted for the
    whole nap, which is why the test asks for half)."""

    def __init__(self, total: int, flip: int = -1, short: bool = False, naps: int = 0):
        self.total, self.flip, self.short, self.seen = total, flip, short, 0
        self.naps, self.slept = naps, 0
        self.real, self.thread = os.read, threading.get_ident()

    def read(self, fd, n):
        if threading.get_ident() != self.thread:
            return self.real(fd, n)
        for _ in range(self.naps):
            time.sleep(0.002)
            self.slept += 1
        data = self.real(fd, n)
        start, self.seen = self.seen, self.seen + len(data)
        if start <= self.flip < self.seen:
            i = self.flip - start
            data = data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1:]
        if self.short:
            data = data[:max(0, self.total - 1 - start)]
        return data

    def __enter__(self):
        os.read = self.read
        return self

    def __exit__(self, *exc):
        os.read = self.real


def _kill_reaps(impl) -> None:
    """Writer(...).kill() reaps the writer it killed, one that takes SLOW_DEATH_S to die too."""
    step(f"Writer(64 MiB, 64 KiB).kill(), the writer taking {SLOW_DEATH_S:g} s to die")
    writer = impl.Writer(64 * MIB, 64 * KIB)
    try:
        with _SlowToDie(writer.pid):
            writer.kill()
            reaped = procfs.reaped(writer.pid)
    finally:
        procfs.kill_and_reap(writer.pid)
    if not reaped:
        raise Fail("kill() returned with the writer not reaped: the README has kill() send "
                   "SIGKILL, then reap the writer; a killed process takes a moment to die (the "
                   f"judge made it take {SLOW_DEATH_S:g} s), so reap it with a blocking wait "
                   "(waitpid(pid, 0)), not one that polls once (WNOHANG)")


@test(input="Writer(64 MiB, 64 KiB).kill() of a writer that takes 0.2 s to die; "
            "transfer(1 MiB, 64 KiB) whose byte 100007 reads wrong; transfer(1 MiB, 64 KiB) "
            "whose last byte never comes (an EOF one byte early)", timeout=40)
def transfer_checks_the_bytes(impl):
    fds = procfs.fd_count()
    _kill_reaps(impl)
    for how, bad in (("byte 100007 wrong", _BadRead(MIB, flip=100007)),
                     ("an EOF one byte early", _BadRead(MIB, short=True))):
        step(f"transfer(1 MiB, 64 KiB) with {how}")
        with bad:
            try:
                got = impl.transfer(MIB, 64 * KIB)
            except ValueError:
                got = None
        if bad.seen == 0:
            return  # the learner reads without os.read: nothing to change under it
        if got is not None:
            raise Fail(f"transfer() returned although the bytes were wrong ({how}): check "
                       "every byte against the pattern, and the count, and raise ValueError",
                       expected="ValueError", got=repr(got)[:120], input=how)
        _nothing_left(fds, f"after the ValueError ({how})", "the writer is still there: "
                      "kill() it when the read fails")


FINISH_THREAD = "judge: writer.finish"


class _RecordedWaits:
    """While active, the seconds of every time.sleep and select.select timeout that the
    thread running finish() asks for (the judge's own waits are left out)."""

    def __enter__(self):
        self.real_sleep, self.real_select, self.waits = time.sleep, select.select, []

        def sleep(seconds):
            self._note(seconds)
            return self.real_sleep(seconds)

        def select_(r, w, x, timeout=None):
            self._note(timeout)
            return self.real_select(r, w, x, timeout)
        time.sleep, select.select = sleep, select_
        return self

    def _note(self, seconds) -> None:
        if threading.current_thread().name == FINISH_THREAD:
            self.waits.append(float("inf") if seconds is None else seconds)

    def __exit__(self, *exc) -> None:
        time.sleep, select.select = self.real_sleep, self.real_select


def _finish_in_thread(writer, timeout: float) -> tuple[str, float]:
    """writer.finish(timeout) in a thread: (what it did, seconds); a finish still waiting
    HANG_S past its timeout is unblocked by killing the writer, and reported so."""
    outcome, started, done = ["returned"], time.monotonic(), threading.Event()

    def run():
        try:
            outcome[0] = f"returned {writer.finish(timeout)!r}"
        except BaseException as e:  # what finish raised is the verdict
            outcome[0] = f"{type(e).__name__}: {e}"
        done.set()
    threading.Thread(target=run, name=FINISH_THREAD, daemon=True).start()
    if not done.wait(timeout + HANG_S):
        procfs.signal_quietly(writer.pid, signal.SIGKILL)
        done.wait(WAIT_S)
        return "hung", time.monotonic() - started
    return outcome[0], time.monotonic() - started


class _SlowToDie:
    """While active, os.kill(pid, SIGKILL) returns at once and the signal lands SLOW_DEATH_S
    later, through a pidfd (never another process that took the pid): a killed process is gone
    only once the kernel has torn it down, which on a busy machine takes a while. Code that
    reaps with a blocking wait after the kill is unaffected; one that polls once (WNOHANG) and
    moves on leaves the writer behind, every time instead of on an unlucky schedule."""

    def __init__(self, pid: int):
        self.pid, self.pidfd, self.timers = pid, os.pidfd_open(pid), []

    def __enter__(self):
        real = self.real = os.kill

        def kill(pid, sig):
            if pid != self.pid or sig != signal.SIGKILL:
                return real(pid, sig)
            timer = threading.Timer(SLOW_DEATH_S, self._deliver)
            self.timers.append(timer)
            timer.start()
        os.kill = kill
        return self

    def _deliver(self) -> None:
        try:
            signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
        except ProcessLookupError:  # reaped meanwhile
            pass

    def __exit__(self, *exc) -> None:
        os.kill = self.real
        for timer in self.timers:
            timer.join()
        os.close(self.pidfd)


def _finish_after(impl, sig, timeout: float, slow_to_die: bool = False):
    """Writer(64 MiB, 64 KiB), sent `sig` (None: nothing), then finish(timeout) in a thread:
    (what it returned or raised, seconds, whether the writer was reaped by then)."""
    writer = impl.Writer(64 * MIB, 64 * KIB)
    if sig is not None:
        os.kill(writer.pid, sig)
    try:
        if slow_to_die:
            with _SlowToDie(writer.pid):
                got, took = _finish_in_thread(writer, timeout)
                reaped = procfs.reaped(writer.pid)
        else:
            got, took = _finish_in_thread(writer, timeout)
            reaped = procfs.reaped(writer.pid)
    finally:
        procfs.kill_and_reap(writer.pid)
    return got, took, reaped


@test(input="Writer(64 MiB, 64 KiB) whose read end is closed, reaped by the judge; "
            "Writer(64 MiB, 64 KiB) then finish() at once (the writer gets EPIPE and exits 1); "
            "one killed by SIGKILL, then finish(); "
            "Writer(64 MiB, 64 KiB) stopped (SIGSTOP), then finish(timeout=0.5)", timeout=40)
def finish_reports_errors(impl):
    step("Writer(64 MiB, 64 KiB) whose read end the judge closed (EPIPE): its exit code")
    writer = impl.Writer(64 * MIB, 64 * KIB)
    os.close(writer.read_fd)  # the reader is gone: the writer's next write fails with EPIPE
    try:
        code = os.waitstatus_to_exitcode(os.waitpid(writer.pid, 0)[1])
    finally:
        procfs.kill_and_reap(writer.pid)
    check_equal(code, 1, "the exit code of a writer whose write failed (EPIPE): the README "
                "fixes os._exit(1) on an error")
    step("finish() of a writer whose reader closed first")
    got, _, reaped = _finish_after(impl, None, WAIT_S)
    if not got.startswith("RuntimeError"):
        raise Fail("finish() of a writer that exited with code 1 (its reader closed the pipe "
                   "first: EPIPE) must raise RuntimeError; the count of a failed transfer "
                   "means nothing", expected="RuntimeError: ...", got=got)
    if not reaped:
        raise Fail("finish() raised RuntimeError but left the writer unreaped: wait4 first, "
                   "then look at its exit status")
    step("finish() of a writer killed by SIGKILL")
    got, _, _ = _finish_after(impl, signal.SIGKILL, WAIT_S)  # a signal: no exit code, no success
    if not got.startswith("RuntimeError"):
        raise Fail("finish() of a writer killed by SIGKILL must raise RuntimeError: its wait "
                   "status holds a signal, not an exit code of 0 (os.waitstatus_to_exitcode "
                   "gives -9)", expected="RuntimeError: ...", got=got)
    step("finish(timeout=0.5) of a stopped writer (SIGSTOP)")
    with _RecordedWaits() as recorded:
        got, took, reaped = _finish_after(impl, signal.SIGSTOP, 0.5,  # alive, never exits
                                          slow_to_die=True)
    if got == "hung":
        raise Fail(f"finish(timeout=0.5) of a stopped writer had not returned {took:.1f} s "
                   "later, when the judge killed the writer: wait with a deadline (wait4 with "
                   "WNOHANG in a loop), not a blocking wait")
    if not got.startswith("TimeoutError"):
        raise Fail("finish(timeout=0.5) of a writer that never exits must raise TimeoutError",
                   expected="TimeoutError: ...", got=got)
    longest = max(recorded.waits, default=0.0)
    if longest > 0.5:
        raise Fail(f"finish(timeout=0.5) slept {longest:g} s in one wait: the README has it kill "
                   "the writer and raise TimeoutError once `timeout` has passed, so no single wait "
                   "may outlast the timeout; poll in short steps (a few ms)",
                   got=f"waits of {sorted(set(recorded.waits))} s")
    if not reaped:
        raise Fail("finish(timeout=0.5) raised TimeoutError but left the writer unreaped: "
                   "kill it with SIGKILL (a stopped process does not act on SIGTERM), then reap "
                   "it with a blocking wait before raising (the judge made the killed writer "
                   f"take {SLOW_DEATH_S:g} s to die, as a busy machine can)", got=got)


class _StoppedWriter:
    """While active, every os.fork() in this process leaves the child stopped (SIGSTOP sent
    before fork returns to the parent), and a thread lets it run for a moment every TRICKLE_S
    until `until`: a writer that is alive, sends bytes in a trickle, then stalls. It also
    records the timeout of each select.select call, and the child pids."""

    def __init__(self, until: float):
        self.real_fork, self.real_select = os.fork, select.select
        self.pids, self.selects, self.stop = [], [], threading.Event()
        self.until, self.gave_up = until, False

    def fork(self):
        pid = self.real_fork()
        if pid:
            os.kill(pid, signal.SIGSTOP)
            self.pids.append(pid)
        return pid

    def select(self, r, w, x, timeout=None):
        self.selects.append((time.monotonic(), timeout))
        return self.real_select(r, w, x, timeout)

    def trickle(self):
        while not self.stop.wait(TRICKLE_S) and time.monotonic() < self.until:
            for pid in self.pids:
                procfs.signal_quietly(pid, signal.SIGCONT)
            time.sleep(0.002)
            for pid in self.pids:
                procfs.signal_quietly(pid, signal.SIGSTOP)

    def give_up(self):
        """The transfer has not given up: end the trickle and the writer (short data)."""
        self.stop.set()
        self.gave_up = True
        for pid in self.pids:
            procfs.signal_quietly(pid, signal.SIGKILL)

    def __enter__(self):
        os.fork, select.select = self.fork, self.select
        self.thread = threading.Thread(target=self.trickle, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        os.fork, select.select = self.real_fork, self.real_select


@test(input="transfer(64 MiB, 64 KiB, timeout=1.0) from a writer that is stopped and let run "
            "for 2 ms every 0.25 s for 1 s, then stalls (times stretched on a busy machine); "
            "first, transfer(64 MiB, 64 KiB, timeout=0.3) from a writer that never runs",
      timeout=30)
def stopped_writer_times_out(impl):
    fds = procfs.fd_count()
    step("transfer(64 MiB, 64 KiB, timeout=0.3) from a writer that never runs")
    if _check_no_wait_past(impl, 0.3):
        _nothing_left(fds, "after the TimeoutError of transfer(timeout=0.3)", "the stopped "
                      "writer is still there: kill and reap it")
    asked = 1.0 * S
    call = f"transfer(timeout={asked:.2g})"
    step(f"{call} from a writer let run for 2 ms every {TRICKLE_S:.2g} s, then stalled")
    started = time.monotonic()
    with _StoppedWriter(until=started + asked) as w:
        timer = threading.Timer(asked + HANG_S, w.give_up)
        timer.start()
        try:
            impl.transfer(64 * MIB, 64 * KIB, timeout=asked)
        except Exception as exc:
            _fail_if_gave_up(w, exc, call, started)
            if not isinstance(exc, TimeoutError):
                raise
        else:
            raise Fail(f"{call} from a writer that never finishes returned")
        finally:
            timer.cancel()
            w.stop.set()
            w.thread.join()
    late = [(round(t - started, 2), timeout) for t, timeout in w.selects
            if timeout is None or t + timeout > started + asked + SELECT_SLACK_S]
    if late:
        raise Fail(f"{call} called select with timeouts that reach past its deadline (bytes "
                   f"came every {TRICKLE_S:.2g} s): a timeout that restarts at every read is an "
                   f"idle timeout; the whole transfer must end within `timeout`",
                   got=f"(seconds since the start, select timeout): {late[:4]}")
    _nothing_left(fds, "after the TimeoutError", "the stopped writer is still there: kill and "
                  "reap it")


def _fail_if_gave_up(w: _StoppedWriter, exc: Exception, call: str, started: float) -> None:
    """Name why the transfer ended only once the judge had killed the stalled writer."""
    if not w.gave_up:
        return
    took = time.monotonic() - started
    if isinstance(exc, TimeoutError):
        raise Fail(f"{call} raised TimeoutError only after the judge killed the stalled writer, "
                   f"{took:.1f} s in: kill() it with SIGKILL (a stopped process does not act "
                   f"on SIGTERM)")
    raise Fail(f"{call} was still reading {took:.1f} s later, when the judge killed the writer; "
               f"a stalled writer must end the transfer with TimeoutError after `timeout` "
               f"seconds in all", got=repr(exc))


def _check_no_wait_past(impl, asked: float) -> bool:
    """transfer(timeout=asked) from a writer stopped from the start: no select may be asked to
    wait longer than the whole transfer may take (the arguments are checked, not the clock).
    False when the transfer hung until the judge killed the writer: the rest of
    stopped_writer_times_out names that."""
    call = f"transfer(timeout={asked})"
    started = time.monotonic()
    with _StoppedWriter(until=0.0) as w:  # never let run: not a byte comes
        timer = threading.Timer(asked + HANG_S, w.give_up)
        timer.start()
        try:
            impl.transfer(64 * MIB, 64 * KIB, timeout=asked)
        except Exception as exc:
            if not (w.gave_up or isinstance(exc, TimeoutError)):
                raise
            _fail_if_gave_up(w, exc, call, started)
        else:
            if not w.gave_up:
                raise Fail(f"transfer(timeout={asked}) from a writer that never writes returned")
        finally:
            timer.cancel()
            w.stop.set()
            w.thread.join()
            for pid in w.pids if w.gave_up else ():
                procfs.kill_and_reap(pid)
    if w.gave_up:
        return False
    longer = [timeout for _, timeout in w.selects if timeout is None or timeout > asked]
    if longer:
        raise Fail(f"transfer(timeout={asked}) called select with a timeout longer than the "
                   f"whole transfer may take: wait at most what is left until the deadline (a "
                   f"fixed tick, or a floor such as max(1.0, left), waits past it)",
                   got=f"select timeouts: {longer[:4]}")
    return True
