"""The judge's tests for exercise 122. Each receives the learner's module as `impl`.

The first two tests drive one side in this process and play the other side by hand. The
slots are a `Watched` buffer: at every load or store the learner's code makes, it counts the
bytes waiting in the doorbell or ack pipe (FIONREAD). So the order of "payload, then doorbell"
and "copy out, then ack" is checked on every run, not left to a lucky race.
"""

from __future__ import annotations

import array
import fcntl
import inspect
import multiprocessing as mp
import os
import random
import re
import select
import termios
import threading
import time

from minivllm.judge import procfs
from minivllm.judge.api import Fail, check_equal, kill_if_alive, scaled, step, test

QUIET_S = 0.2  # how long the tests wait where nothing is supposed to arrive
PROCESS_WAIT_S = scaled(3.0)  # a message or an EOF not seen in this long is lost, not slow


def waiting(fd: int) -> int:
    """Bytes written into the pipe and not yet read (FIONREAD), without reading them."""
    n = array.array("i", [0])
    fcntl.ioctl(fd, termios.FIONREAD, n)
    return n[0]


class Watched:
    """A bytearray that calls on_access(kind, key) before each load or store."""

    def __init__(self, size: int, on_access):
        self.data, self.on_access = bytearray(size), on_access

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, key):
        self.on_access("load", key)
        value = self.data[key]
        return bytes(value) if isinstance(key, slice) else value

    def __setitem__(self, key, value) -> None:
        self.on_access("store", key)
        self.data[key] = value


def _key(key) -> str:
    return f"{key.start}:{key.stop}" if isinstance(key, slice) else str(key)


def slot(data: bytes | bytearray, i: int, slot_bytes: int) -> bytes:
    """Slot i as the README lays it out: 4-byte little-endian length, then the payload."""
    start = i * slot_bytes
    size = int.from_bytes(data[start:start + 4], "little")
    return bytes(data[start + 4:start + 4 + size])


def put(data: bytearray, i: int, slot_bytes: int, payload: bytes) -> None:
    start = i * slot_bytes
    data[start:start + 4 + len(payload)] = len(payload).to_bytes(4, "little") + payload


def _pipes():
    bell_r, bell_w = os.pipe()
    ack_r, ack_w = os.pipe()
    return bell_r, bell_w, ack_r, ack_w


class _SelectLimits:
    """While active, select.select records the limit of each call: a wait's length is read
    from what it asked for, never from a clock."""

    def __init__(self):
        self.real, self.asked = select.select, []

    def select(self, r, w, x, timeout=None):
        self.asked.append(timeout)
        return self.real(r, w, x, timeout)

    def __enter__(self):
        select.select = self.select
        return self

    def __exit__(self, *exc):
        select.select = self.real

    def check(self, call: str) -> None:
        longer = [t for t in self.asked if t is None or t > QUIET_S + 1e-9]
        if longer:
            raise Fail(f"{call} waited in select longer than the timeout it was given: use the "
                       "caller's timeout, not a fixed one", expected=f"limits <= {QUIET_S} s",
                       got=longer, input=call)


def _expect_timeout(call, what: str, input: str) -> None:
    with _SelectLimits() as limits:
        try:
            call()
        except TimeoutError:
            limits.check(input)
            return
    raise Fail(what, expected="TimeoutError", got="it returned", input=input)


@test(input="Sender with 2 slots of 32 bytes; the test plays the receiver and writes the acks, "
            "then closes the ack pipe", timeout=6, hang="send() waited for an ack that the test had already written: count ack bytes, not reads")
def sender_steps(impl):
    for fn in (impl.Sender.send, impl.Sender.flush, impl.Receiver.recv):
        check_equal(inspect.signature(fn).parameters["timeout"].default, 5.0,
                    f"the default timeout of {fn.__qualname__} (the README fixes the signature)")
    slots, sb = 2, 32
    bell_r, bell_w, ack_r, ack_w = fds = _pipes()
    state = {"bells": 0, "message": 0, "early": None, "acks": 0}

    def on_access(kind, key):
        if kind == "store" and waiting(bell_r) > state["bells"] and state["early"] is None:
            state["early"] = (state["message"], key)
    buf = Watched(slots * sb, on_access)
    msgs = [b"m0-hello", bytes(range(28)), b"m2", b"m3-three", b""]  # m1 fills a slot exactly
    try:
        s = impl.Sender(buf, slots, sb, bell_w, ack_r)

        def send(k, timeout=1.0):
            state["message"] = k
            try:
                s.send(msgs[k], timeout=timeout)
            except TimeoutError:
                if k == 4:
                    raise  # the test's own message: two acks in one read
                raise Fail(f"send() of message {k} raised TimeoutError although a slot was free "
                           f"(acks written so far: {state['acks']} for {k} messages sent, "
                           f"{slots} slots): wait for an ack only while every slot holds an "
                           "unacknowledged message", input=f"send(message {k})") from None
            if state["early"]:
                m, key = state["early"]
                raise Fail(f"the doorbell rang before message {m} was in its slot: a receiver woken "
                           "by it would copy stale bytes. Write the length and payload, then ring",
                           got=f"buf[{_key(key)}] stored while the doorbell byte was already in the pipe",
                           input=f"send(message {m})")
            state["bells"] += 1
            check_equal(waiting(bell_r), state["bells"], f"doorbell bytes after sending message {k} "
                        "(one byte per message)")
            start = (k % slots) * sb
            check_equal(bytes(buf.data[start:start + 4]), len(msgs[k]).to_bytes(4, "little"),
                        f"slot {k % slots}'s length header after sending message {k} (the "
                        f"payload's {len(msgs[k])} bytes as 4-byte little-endian)")
            check_equal(slot(buf.data, k % slots, sb), msgs[k], f"slot {k % slots} after sending message {k}")

        send(0)
        send(1)
        _expect_timeout(lambda: s.send(msgs[2], timeout=QUIET_S),
                        "send() must wait for an ack when every slot holds an unacknowledged message, "
                        "and raise TimeoutError when none comes", "send(message 2) with no ack yet")
        if slot(buf.data, 0, sb) != msgs[0]:
            raise Fail("message 0 was overwritten before the receiver acknowledged it: the sender must "
                       "wait for an ack (a free slot) before it writes", expected=msgs[0],
                       got=slot(buf.data, 0, sb), input="send(message 2) with 2 slots and no ack")
        os.write(ack_w, b"\x01")
        state["acks"] = 1
        send(2)
        os.write(ack_w, b"\x01\x01")  # two acks in one write: they come out of one os.read
        state["acks"] = 3
        send(3)
        try:
            send(4, timeout=QUIET_S)
        except TimeoutError:
            raise Fail("send() timed out although two acks were waiting: two ack bytes that arrive in "
                       "one os.read free two slots (count bytes, not reads)",
                       input="acks b'\\x01\\x01' in one write, then send(message 3), send(message 4)")
        _expect_timeout(lambda: s.flush(timeout=QUIET_S), "flush() must wait until every message is "
                        "acknowledged, and raise TimeoutError when the acks do not come",
                        "flush() with messages 3 and 4 not acknowledged")
        os.write(ack_w, b"\x01")
        _expect_timeout(lambda: s.flush(timeout=QUIET_S), "flush() must wait until every message is "
                        "acknowledged, not only until one slot is free",
                        "flush() with message 4 not acknowledged")
        os.write(ack_w, b"\x01")
        s.flush(timeout=1.0)
        try:
            s.send(bytes(sb - 3))
        except ValueError:
            pass
        else:
            raise Fail("a payload larger than slot_bytes - 4 must raise ValueError",
                       input=f"send({sb - 3} bytes) with slot_bytes={sb}")
        os.close(ack_w)  # the receiver is gone
        fds = (bell_r, bell_w, ack_r)
        _send_to_a_dead_receiver(s, msgs, ack_r)
    finally:
        for fd in fds:
            os.close(fd)


EOF_READS = 100  # os.read calls that returned b"" (end of file): only a loop ignoring it makes


def _send_to_a_dead_receiver(s, msgs, ack_r: int) -> None:
    """The ack pipe's write end is closed (the receiver died): fill the ring, send once more.
    The ack pipe reads b"" at once, forever; send() must raise EOFError, not loop on it (a
    send that reads that b"" EOF_READS times is stopped there: os.read is counted)."""
    s.send(msgs[0])
    s.send(msgs[2])
    out, done, real_read, eofs = {}, threading.Event(), os.read, [0]

    def counted_read(fd, n):
        data = real_read(fd, n)
        if fd == ack_r and not data:
            eofs[0] += 1
            if eofs[0] >= EOF_READS:
                done.set()
        return data

    def run():
        try:
            s.send(msgs[3], timeout=QUIET_S)
            out["got"] = "it returned"
        except BaseException as exc:
            out["got"] = exc
        done.set()
    os.read = counted_read
    try:
        t = threading.Thread(target=run, daemon=True)
        t.start()
        done.wait(scaled(3.0))  # a hang guard: the EOF is there at once
    finally:
        os.read = real_read
    looping = f"still running after {eofs[0]} os.read calls that returned b'' (end of file)"
    got = out.get("got", looping if eofs[0] >= EOF_READS else "still running")
    if not isinstance(got, EOFError):
        raise Fail("send() on a full ring whose ack pipe is closed (the receiver is gone) must "
                   "raise EOFError: os.read returning b'' means no ack will ever come",
                   expected="EOFError", got=repr(got) if isinstance(got, BaseException) else got,
                   input="2 messages unacknowledged, the ack pipe's write end closed, send()")


SAMPLE_S = 0.005  # how often the judge looks at the waiting thread's state
RUNNING_SHARE = 0.5  # a thread that waits in select is asleep ('S'); a spinner is running or runnable


READ_SYSCALL = {"x86_64": 0, "aarch64": 63}.get(os.uname().machine)


def _blocked_in_read(tid: int, fd: int) -> bool:
    """Whether thread tid sleeps in read(fd) (/proc/self/task/TID/syscall: number, then args)."""
    try:
        with open(f"/proc/self/task/{tid}/syscall") as f:
            fields = f.read().split()
    except OSError:
        return False
    return len(fields) > 1 and fields[0] == str(READ_SYSCALL) and int(fields[1], 16) == fd


def _recv_asleep(r, bell_r: int):
    """recv() with nothing to come, on a thread whose state the judge samples: waiting in
    select is sleeping, whatever the load; polling os.read in a loop is running (or runnable);
    sleeping in a blocking os.read of the doorbell never ends, and fails at once."""
    out, tid = {}, []

    def run():
        tid.append(threading.get_native_id())
        try:
            out["got"] = r.recv(timeout=QUIET_S * 2)
        except BaseException as exc:  # raised again in the test's thread
            out["exc"] = exc
    t = threading.Thread(target=run, daemon=True)
    t.start()
    states = []
    while t.is_alive():
        if tid:
            state = procfs.thread_state(tid[0])
            if state == "X":
                break  # the thread ended between the check and the read
            states.append(state)
            if state == "S" and _blocked_in_read(tid[0], bell_r):
                raise Fail("recv() with no doorbell pending blocked in os.read(bell_r): that "
                           "read returns only when a byte comes, so the timeout is never "
                           "honoured; wait with select(bell_r, timeout) first, read only once "
                           "it says a byte is there")
        time.sleep(SAMPLE_S)
    t.join()
    running = states.count("R")
    if len(states) >= 5 and running > RUNNING_SHARE * len(states):
        raise Fail("recv() with no doorbell pending kept running instead of sleeping: wait with "
                   "select(bell_r, timeout), which sleeps until a byte comes, not a loop of "
                   "non-blocking reads", got=f"running in {running} of {len(states)} samples")
    if "exc" in out:
        raise out["exc"]
    return out["got"]


@test(input="Receiver with 2 slots of 32 bytes; the test plays the sender and rings the doorbell",
      timeout=4, hang="recv() blocked in os.read although no doorbell had rung: wait with select and a timeout first")
def receiver_steps(impl):
    slots, sb = 2, 32
    bell_r, bell_w, ack_r, ack_w = fds = _pipes()
    state = {"returned": 0, "early": None}

    def on_access(kind, key):
        if waiting(ack_r) > state["returned"] and state["early"] is None:
            state["early"] = (state["returned"], key)
    buf = Watched(slots * sb, on_access)
    msgs = [b"m0-hello", bytes(range(28)), b"m2-wrapped"]
    try:
        r = impl.Receiver(buf, slots, sb, bell_r, ack_w)
        check_equal(_recv_asleep(r, bell_r), None, "recv() before any doorbell (after its timeout)")
        put(buf.data, 0, sb, msgs[0])
        put(buf.data, 1, sb, msgs[1])
        os.write(bell_w, b"\x01\x01")  # two doorbells in one write: they come out of one os.read

        def recv(k, how):
            got = r.recv(timeout=1.0)
            if state["early"]:
                m, key = state["early"]
                raise Fail(f"message {m} was acknowledged before it was copied out: the sender may "
                           "already be overwriting the slot. Copy the payload out, then ack",
                           got=f"buf[{_key(key)}] loaded while the ack was already in the pipe",
                           input=f"recv() of message {m}")
            if got is None and k == 1:
                raise Fail("message 1 was lost: two doorbell bytes that arrive in one os.read are two "
                           "messages (count bytes, not reads)", expected=msgs[1], got=None, input=how)
            check_equal(got, msgs[k], f"message {k}", how)
            state["returned"] += 1
            check_equal(waiting(ack_r), state["returned"], f"ack bytes after recv() returned message {k} "
                        "(one byte per message, written before recv returns)", how)
        recv(0, "slots 0 and 1 filled, doorbell b'\\x01\\x01' in one write")
        recv(1, "slots 0 and 1 filled, doorbell b'\\x01\\x01' in one write")
        with _SelectLimits() as limits:
            check_equal(r.recv(timeout=QUIET_S), None, "recv() with no new doorbell")
        limits.check(f"recv(timeout={QUIET_S}) with no new doorbell")
        put(buf.data, 0, sb, msgs[2])
        os.write(bell_w, b"\x01")
        recv(2, "a third message, back in slot 0")
        put(buf.data, 1, sb, msgs[0])
        put(buf.data, 0, sb, msgs[1])
        os.write(bell_w, b"\x01\x01")
        os.close(bell_w)  # the sender rang twice and exited at once
        fds = (bell_r, ack_r, ack_w)
        how = "two doorbells in one write, then the doorbell closed"
        for k in (0, 1):
            try:
                got = r.recv(timeout=1.0)
            except EOFError:
                raise Fail("recv() raised EOFError while a message whose doorbell it had read was "
                           "still in its slot: deliver every rung message before the EOF",
                           expected=msgs[k], got="EOFError", input=how)
            check_equal(got, msgs[k], f"message {3 + k}", how)
        for call in ("", "again "):
            try:
                got = r.recv(timeout=1.0)
            except EOFError:
                continue
            raise Fail(f"recv() called {call}after the sender closed the doorbell must raise "
                       "EOFError (os.read returns b'', every time)", expected="EOFError", got=got,
                       input="the doorbell's write end closed")
    finally:
        for fd in fds:
            os.close(fd)


def _rss_kib(name: str) -> int:
    """Resident KiB of this process's mappings of /dev/shm/name (/proc/self/smaps)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            if re.match(r"[0-9a-f]+-[0-9a-f]+ ", line):
                inside = line.rstrip().endswith(name)
            elif inside and line.startswith("Rss:"):
                total += int(line.split()[1])
    return total


@test(input="DoorbellChannel(2 slots of 64 KiB), both sides in this process, then close()")
def channel(impl):
    slots, sb = 2, 64 * 1024
    step("DoorbellChannel(1, 4096), then DoorbellChannel(2, 65536)")
    other = impl.DoorbellChannel(1, 4096)  # a second channel side by side, untouched
    ch = impl.DoorbellChannel(slots, sb)
    name = ch.name.lstrip("/")
    fds = [ch.bell_r, ch.bell_w, ch.ack_r, ch.ack_w]
    others = [other.bell_r, other.bell_w, other.ack_r, other.ack_w]
    rss = _rss_kib(name)
    if rss < slots * sb // 1024:
        ch.close()
        raise Fail("the segment is not prefaulted: touch every page once when you create it "
                   "(write zeros), so no message pays the page faults", expected=f"{slots * sb // 1024} KiB "
                   "resident", got=f"{rss} KiB resident", input="right after DoorbellChannel(2, 65536)")
    step("sender(), receiver(), then send(A), recv(), send(B), send(C)")
    s, r = ch.sender(), ch.receiver()
    a, b, c = b"A" * 60000, b"B" * 100, b"C" * 100
    s.send(a)
    got = r.recv(timeout=1.0)
    s.send(b)
    s.send(c, timeout=1.0)  # takes the ack of `a`, then reuses its slot
    if got != a or not isinstance(got, bytes):
        kind, head = type(got).__name__, bytes(got[:8]) if got is not None else None
        _close_anyway(ch, got)
        raise Fail("recv() must return a copy (bytes): the ack lets the sender reuse the slot, so a "
                   "view into the segment changes under the caller", expected="bytes, 60000 x b'A'",
                   got=f"{kind} starting {head!r}", input="send(A), recv(), send(B), send(C)")
    step("recv() twice (B, C), then flush()")
    check_equal([r.recv(timeout=1.0), r.recv(timeout=1.0)], [b, c], "the next two messages")
    s.flush(timeout=1.0)
    step("close(), then close() again")
    ch.close()
    ch.close()  # a second close does nothing
    still_open = [fd for fd in fds if _is_open(fd)]
    if still_open:
        raise Fail("close() must close all four pipe ends", got=f"fds {still_open} still open")
    if procfs.maps_shm(name):
        raise Fail(f"after close() this process still maps /dev/shm/{name}: close the segment")
    if os.path.exists(f"/dev/shm/{name}"):
        raise Fail(f"after close() /dev/shm/{name} still exists: the creator must unlink the segment")
    closed = [fd for fd in others if not _is_open(fd)]
    step("close() of the other channel")
    other.close()
    if closed:
        raise Fail("closing one channel closed another channel's pipe ends: each channel owns its "
                   "own fds (a set at class level is shared by every instance)",
                   got=f"the other channel's fds {closed} closed", input="two channels, close() one")


def _close_anyway(ch, view) -> None:
    if isinstance(view, memoryview):
        view.release()  # a view into the segment keeps close() from unmapping it
    try:
        ch.close()
    except Exception:
        pass  # the failure being reported is the point; the judge sweeps what is left


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


def _messages(seed: int, count: int, max_len: int) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(rng.choice([0, 1, 100, 4096, max_len])) for _ in range(count)]


def _receiver_process(ch, count, max_len, report):
    problem = None
    try:
        ch.keep("receiver")
        r, expected = ch.receiver(), _messages(count, count, max_len)
        for k, want in enumerate(expected):
            got = r.recv(timeout=PROCESS_WAIT_S)
            if got != want:
                problem = (f"message {k} came out wrong", f"{len(want)} bytes",
                           "nothing (timed out)" if got is None else f"{len(got)} other bytes")
                break
        else:
            try:
                extra = r.recv(timeout=PROCESS_WAIT_S)
                problem = ("after the last message, recv() must raise EOFError once the sender closes",
                           "EOFError", "no doorbell and no EOF within "
                           f"{PROCESS_WAIT_S:g} s: a process still holds the doorbell's write end "
                           "(did keep('receiver') close it?)" if extra is None else f"{len(extra)} bytes")
            except EOFError:
                pass
        ch.close()
    except Exception as exc:  # reported, so the test says what broke in the child
        problem = ("the receiver process raised", "no exception", f"{type(exc).__name__}: {exc}")
    report.send(problem)
    report.close()


@test(input="a forked receiver process, 300 messages of 0 B to 64 KiB through 3 slots, then close",
      timeout=30, hang="the sender or the receiver waited forever for a doorbell or an ack")
def processes(impl):
    slots, sb, count = 3, 64 * 1024 + 4, 300
    ch = impl.DoorbellChannel(slots, sb)
    report_r, report_w = mp.Pipe(duplex=False)
    proc = mp.get_context("fork").Process(target=_receiver_process,
                                          args=(ch, count, sb - 4, report_w))
    proc.start()
    report_w.close()
    sent, failure = 0, None
    ch.keep("sender")
    left = [fd for fd in (ch.bell_r, ch.ack_w) if _is_open(fd)]
    if left:
        kill_if_alive(proc)
        ch.close()
        raise Fail(f"keep('sender') left the receiver's pipe ends open (fds {left}): a process "
                   "that keeps the doorbell's write end means the receiver never reads EOF "
                   "when the sender closes; keep() closes the two ends the other side uses")
    try:
        s = ch.sender()
        for m in _messages(count, count, sb - 4):
            s.send(m, timeout=PROCESS_WAIT_S)
            sent += 1
        s.flush(timeout=PROCESS_WAIT_S)
    except (TimeoutError, EOFError, OSError) as exc:
        failure = exc
    ch.close()
    problem = report_r.recv() if report_r.poll(2 * PROCESS_WAIT_S + 2) else ("no report", "a report", "none")
    proc.join(5)
    kill_if_alive(proc)
    where = f"{count} messages through {slots} slots, receiver in a forked process"
    if problem:
        what, want, got = problem
        raise Fail(f"receiver: {what}", expected=want, got=got, input=where)
    if failure:
        raise Fail(f"the sender failed after {sent} messages: {type(failure).__name__}: {failure}",
                   input=where)


def _child_closes(ch) -> None:
    ch.keep("receiver")
    ch.close()


def _same_pipe(r: int, w: int) -> bool:
    try:
        os.write(w, b"?")
        return os.read(r, 1) == b"?"
    except OSError:
        return False


def _reuse(r_fd: int, w_fd: int, closer: str) -> tuple[int, int]:
    """A new pipe on the fd numbers r_fd and w_fd, which `closer` must have closed: what any
    later open() in the process may get."""
    left = [fd for fd in (r_fd, w_fd) if _is_open(fd)]
    if left:
        raise Fail(f"{closer} left fds {left} open", input=f"fds {r_fd}, {w_fd}")
    r, w = os.pipe()
    for src, dst in ((r, r_fd), (w, w_fd)):
        if src != dst:
            os.dup2(src, dst)
    for src in (r, w):
        if src not in (r_fd, w_fd):
            os.close(src)
    return r_fd, w_fd


@test(input="DoorbellChannel(2, 4096); a forked child keeps the receiver side and closes; the "
            "parent keeps the sender side, puts a pipe on the fd numbers keep() freed, closes, "
            "puts another pipe on those close() freed, closes again", timeout=15)
def close_owns_only_its_own(impl):
    ch = impl.DoorbellChannel(2, 4096)
    name = ch.name.lstrip("/")
    proc = mp.get_context("fork").Process(target=_child_closes, args=(ch,))
    proc.start()
    proc.join(scaled(10))
    kill_if_alive(proc)
    if not os.path.exists(f"/dev/shm/{name}"):
        ch.close()
        raise Fail("a forked child's close() unlinked the segment while its creator still uses it: "
                   "only the process that created the channel unlinks (remember its pid)",
                   got=f"/dev/shm/{name} gone after the child's close()")
    ch.keep("sender")
    pipes = [_reuse(ch.bell_r, ch.ack_w, "keep('sender')")]
    ch.close()
    pipes.append(_reuse(ch.bell_w, ch.ack_r, "close()"))
    ch.close()
    try:
        for r, w in pipes:
            if not _same_pipe(r, w):
                raise Fail("close() closed file descriptors that were no longer the channel's: "
                           "after keep() or an earlier close() freed them, this process reused "
                           "the numbers for a new pipe. Close each of your fds once, and forget it",
                           got=f"the test's pipe ({r}, {w}) was closed by DoorbellChannel.close()",
                           input="fds freed by keep() and close(), reused by a new pipe")
    finally:
        for fd in [fd for pair in pipes for fd in pair if _is_open(fd)]:
            os.close(fd)
    if os.path.exists(f"/dev/shm/{name}"):
        raise Fail(f"after the creator's close() /dev/shm/{name} still exists: the creator "
                   f"unlinks the segment, even when a child closed first")
