"""The judge's tests for exercise 121. Each receives the learner's module as `impl`."""

import fcntl
import re
import socket
import struct
import termios
import threading
from concurrent.futures import ThreadPoolExecutor
import time

from minivllm.judge.api import Fail, check_equal, scaled, step, test
from minivllm.judge.properties import for_all, st


def _pair():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    b.settimeout(5)  # a recv that waits for bytes that never come fails, not hangs
    return a, b


class _Watched(socket.socket):
    """A socket that notes what the learner's reads do, so that a loop that never ends is named
    at once instead of by the time limit: recv() called again and again after it returned b""
    (end of file), recv() on a socket made blocking, and recv() again after a socket.timeout.
    `wake` is set when one of these happens (the test, in another thread, fails at once)."""

    AFTER_EOF = 100  # recv() calls after end of file that only a loop ignoring b"" makes

    def __init__(self, sock: socket.socket) -> None:
        super().__init__(sock.family, sock.type, sock.proto, fileno=sock.detach())
        self.eof_reads, self.timed_out, self.problem = 0, False, ""
        self.wake = threading.Event()

    def _note(self, problem: str) -> None:
        self.problem = self.problem or problem
        self.wake.set()

    def _read(self, read, *args):
        if self.gettimeout() is None:
            self._note("recv() on a socket made blocking (its timeout was 0.1 s): a silent peer "
                       "then hangs the caller; leave the caller's timeout as it is")
        if self.timed_out:
            self._note("recv() again after the socket raised socket.timeout: the timeout must "
                       "reach the caller, not be retried")
        if self.eof_reads >= self.AFTER_EOF:
            raise Fail(f"recv() was called {self.AFTER_EOF} times after it returned b\"\" (end of "
                       "file): the peer closed, and every later recv() returns b\"\" at once; "
                       "stop and raise ConnectionError with the count of missing bytes")
        try:
            got = read(*args)
        except TimeoutError:
            self.timed_out = True
            raise
        if isinstance(got, bytes) and not got or got == 0:
            self.eof_reads += 1
        return got

    def recv(self, *args):
        return self._read(super().recv, *args)

    def recv_into(self, *args):
        return self._read(super().recv_into, *args)


PIECES = (1, 1, 1, 1, 7, 997)  # bytes per send(), in turn: headers arrive a byte at a time


def _queued(sock) -> int:
    return int.from_bytes(fcntl.ioctl(sock.fileno(), termios.FIONREAD, bytes(4)), "little")


def _cut(data, sizes=PIECES):
    """data in pieces of sizes[0], sizes[1], ... bytes, the sizes taken in turn."""
    pieces, i, k = [], 0, 0
    while i < len(data):
        pieces.append(data[i:i + sizes[k % len(sizes)]])
        i, k = i + len(pieces[-1]), k + 1
    return pieces


def _trickle(sock, pieces, reader, close=True):
    """Send the pieces from a thread, each only once the reader has taken the last one: every
    recv() sees exactly one piece, whatever the machine's speed or load. Quiet when the test
    gives up early: its own failure says what went wrong."""
    def run():
        try:
            for piece in pieces:
                sock.sendall(piece)
                while reader.fileno() >= 0 and _queued(reader):
                    time.sleep(0.0002)
        except (OSError, ValueError):
            pass  # the reader gave up and closed its end (a closed fd: ValueError from ioctl)
        finally:
            if close:
                sock.close()
    t = threading.Thread(target=run)
    t.start()
    return t


BOUNDARY_SIZES = (65535, 65536)  # one byte under and at 2**16: a 4-byte header has room


def _read_frame(sock) -> bytes:
    """The judge's own reader: a header, then exactly that many bytes."""
    def exact(n):
        data = b""
        while len(data) < n:
            piece = sock.recv(n - len(data))
            if not piece:
                raise Fail(f"send_frame's bytes ended with {n - len(data)} of {n} missing")
            data += piece
        return data
    return exact(struct.unpack("!I", exact(4))[0])


BIG_FRAME = 4 << 20  # far over a socket's buffer: one send() cannot take it all


def _whole_frame_through_a_timeout_socket(impl) -> None:
    """A socket with a timeout is non-blocking underneath, so one send() takes only what fits
    in the buffer and returns the count; the rest is the caller's to send."""
    a, b = _pair()
    a.settimeout(5)
    payload = bytes(range(256)) * (BIG_FRAME // 256)
    try:
        with ThreadPoolExecutor(1) as pool:
            reading = pool.submit(_read_frame, b)
            impl.send_frame(a, payload)
            timeout = a.gettimeout()
            a.shutdown(socket.SHUT_WR)  # whatever send_frame did not send never comes now
            try:
                got = reading.result()
            except Fail as exc:
                raise Fail(f"send_frame returned before sending all of a {BIG_FRAME}-byte frame "
                           f"on a socket with a timeout: one send() sends only what fits in the "
                           f"socket's buffer and returns the count; use sendall()",
                           got=exc.message) from None
        if got != payload:
            raise Fail(f"a frame of {BIG_FRAME} bytes came out wrong", got=f"{len(got)} bytes")
        check_equal(timeout, 5.0, "the socket's timeout after send_frame (the caller's own: "
                    "leave it as you found it)")
    finally:
        a.close()
        b.close()


@test(input="b'hello', b'', 65535 and 65536 bytes sent with send_frame, read back by the judge; "
            "a 4 MiB frame through a socket with a timeout (one send() takes only part); "
            "b'' written by the judge, read with recv_frame")
def round_trip(impl):
    a, b = _pair()
    try:
        step("send_frame(sock, b''), then send_frame(sock, b'hello'), read back by the judge")
        impl.send_frame(a, b"")
        impl.send_frame(a, b"hello")
        check_equal(b.recv(4), struct.pack("!I", 0), "send_frame(b'') on the wire (a header "
                    "saying 0: an empty frame is a frame)")
        check_equal(b.recv(4), struct.pack("!I", 5), "the header on the wire (4 bytes, big-endian)")
        check_equal(b.recv(5), b"hello", "the payload after the header")
        for size in BOUNDARY_SIZES:
            payload = bytes(range(256)) * (size // 256) + b"z" * (size % 256)
            step(f"send_frame(sock, {size} bytes), read back by the judge")
            with ThreadPoolExecutor(1) as pool:  # the judge reads while send_frame writes
                reading = pool.submit(_read_frame, b)
                try:
                    impl.send_frame(a, payload)
                except Exception as exc:
                    a.shutdown(socket.SHUT_WR)  # ends the judge's read
                    raise Fail(f"send_frame of {size} bytes raised: the header holds any "
                               f"length below 2**32", got=repr(exc))
                got = reading.result()
            if got != payload:
                raise Fail(f"a frame of {size} bytes came out wrong: the header holds any length "
                           f"below 2**32", expected=f"{size} bytes", got=f"{len(got)} bytes")
        _whole_frame_through_a_timeout_socket(impl)
        a.sendall(struct.pack("!I", 0))
        step("recv_frame of an empty frame (a header saying 0)")
        try:
            got = impl.recv_frame(b)
        except Exception as exc:
            raise Fail("an empty frame (a header saying 0) is a valid frame: recv_frame must "
                       "return b'' without waiting for more", got=repr(exc))
        check_equal(got, b"", "an empty frame")
    finally:
        a.close()
        b.close()


@test(input="frames of 3, 0, 2 and 700 bytes glued into one send(), then a close at once")
def glued_frames(impl):
    a, b = _pair()
    frames = [b"abc", b"", b"de", bytes(range(100)) * 7]
    ends, wire = [], b""
    for f in frames:
        wire += struct.pack("!I", len(f)) + f
        ends.append(len(wire))
    a.sendall(wire)
    a.close()
    try:
        for i, f in enumerate(frames):
            step(f"recv_frame of frame {i} ({len(f)} bytes) of the glued frames")
            try:
                got = impl.recv_frame(b)
            except Exception as exc:
                got = exc
            taken = len(wire) - _queued(b)
            if taken > ends[i]:
                raise Fail(f"recv_frame for frame {i} ({len(f)} bytes) took {taken - ends[i]} "
                           f"bytes of the next frame out of the socket: it read past the frame's "
                           f"end. Ask recv() for at most the bytes still missing; the rest "
                           f"belongs to the next call", got=repr(got)[:80])
            if got != f:
                raise Fail(f"frame {i} of frames glued into one send() came out wrong",
                           expected=repr(f)[:80], got=repr(got)[:80])
        step("recv_frame after the last glued frame (the peer closed)")
        try:
            last = impl.recv_frame(b)
        except Exception as exc:
            last = exc
        check_equal(last, None, "recv_frame after every frame was read and the peer closed "
                    "cleanly between frames (None)")
    finally:
        b.close()


@test(input="4 frames (1000 B, 0 B, 65535 B, 65536 B) arriving in pieces of 1 to 997 bytes, "
            "then a clean close",
      hang="recv_frame waits for bytes that are not coming: is recv_exact asking for the right count?")
def partial_reads(impl):
    a, b = _pair()
    frames = [bytes(range(256)) * 4, b"", b"x" * 65535, b"y" * 65536]
    wire = b"".join(struct.pack("!I", len(f)) + f for f in frames)
    t = _trickle(a, _cut(wire), b)
    try:
        for i, f in enumerate(frames):
            step(f"recv_frame of frame {i} ({len(f)} bytes), arriving in pieces")
            try:
                got = impl.recv_frame(b)
            except Exception as exc:
                raise Fail(f"frame {i} failed: a recv() may return fewer bytes than asked, so read "
                           "in a loop until you have them all", got=repr(exc),
                           input="pieces of 1, 1, 1, 1, 7 and 997 bytes per recv()")
            if got is not None and len(got) > len(f):
                raise Fail(f"frame {i} came out {len(got) - len(f)} bytes longer than its header "
                           "says: recv_exact asked recv() for more than the bytes still missing "
                           "and took the next frame's bytes with them. Ask for n minus what you "
                           "have, each time", expected=f"{len(f)} bytes", got=f"{len(got)} bytes",
                           input="pieces of 1, 1, 1, 1, 7 and 997 bytes per recv()")
            if got != f:
                raise Fail(f"frame {i} came out wrong: a recv() may return fewer bytes than asked",
                           expected=f"{len(f)} bytes", got=f"{len(got) if got is not None else None} bytes",
                           input="pieces of 1, 1, 1, 1, 7 and 997 bytes per recv()")
            check_equal(type(got).__name__, "bytes", f"the type recv_frame returned for frame {i}")
        step("recv_frame after the last frame (the peer closed)")
        try:
            last = impl.recv_frame(b)
        except Exception as exc:
            last = exc
        check_equal(last, None, "recv_frame after the peer closed between frames (a clean end)")
    finally:
        b.close()  # first, so that a blocked sender fails instead of waiting forever
        t.join()


CLOSES = [(struct.pack("!I", 10) + b"abcd", "inside the payload", 6),
          (b"\x00\x00", "inside the header", 2),
          (struct.pack("!I", 2**31) + b"abcd", "inside a payload of 2**31 bytes", 2**31 - 4)]


@test(input="a header saying 10 bytes, then 4 bytes, then close; a close after 2 header bytes; "
            "a header saying 2**31 bytes, then 4 bytes, then close",
      timeout=4, hang="a loop that keeps calling recv() after it returned b\"\" (EOF) never ends")
def close_inside_a_frame(impl):
    for wire, where, missing in CLOSES:
        a, b = _pair()
        b = _Watched(b)
        a.sendall(wire)
        a.close()
        try:
            got = impl.recv_frame(b)
        except ConnectionError as e:
            if not re.search(rf"\b{missing}\b", str(e)):
                raise Fail(f"the ConnectionError for a close {where} must say how many bytes were "
                           f"missing ({missing})", got=str(e), input=repr(wire))
            continue
        except Fail:
            raise
        except Exception as e:
            raise Fail(f"a close {where} must raise ConnectionError", got=repr(e), input=repr(wire))
        finally:
            b.close()
        signed = " (a length of 2**31 or more read as a signed int is negative: the header is " \
                 "unsigned, '!I')" if where.endswith("2**31 bytes") else ""
        raise Fail(f"a close {where} must raise ConnectionError, not return{signed}",
                   got=repr(got)[:80], input=repr(wire))


class _Huge:
    """Says it holds 2**32 bytes without holding them: the size check must come first."""

    def __len__(self) -> int:
        return 2**32


@test(input="a payload of 2**32 bytes, one more than a 4-byte length can say")
def too_large(impl):
    a, b = _pair()
    try:
        try:
            impl.send_frame(a, _Huge())
        except ValueError:
            pass
        except Exception as exc:
            raise Fail("a payload of 2**32 bytes or more must raise ValueError", got=repr(exc))
        else:
            raise Fail("a payload of 2**32 bytes or more must raise ValueError; send_frame returned")
        b.setblocking(False)
        try:
            sent = b.recv(16)
        except BlockingIOError:
            sent = b""
        check_equal(sent, b"", "what send_frame sent before refusing")
    finally:
        a.close()
        b.close()


@test(input="a peer that sends 2 header bytes, then nothing, holding its end open; the reading "
            "socket has a timeout of 0.1 s", timeout=20)
def stubborn_peer(impl):
    a, b = _pair()
    b = _Watched(b)
    b.settimeout(0.1)
    a.sendall(b"\x00\x00")
    outcome, done = [], threading.Event()

    def read():
        try:
            outcome.append(impl.recv_frame(b))
        except BaseException as exc:
            outcome.append(exc)
        done.set()
        b.wake.set()
    threading.Thread(target=read, daemon=True).start()
    try:
        b.wake.wait(scaled(5.0))  # 50 times the socket's timeout: only a hang waits it out
        if b.problem:
            raise Fail(f"recv_frame on a socket with a 0.1 s timeout, whose peer went silent "
                       f"inside a header: {b.problem}")
        if not done.is_set():
            raise Fail("recv_frame on a socket with a 0.1 s timeout, whose peer went silent "
                       "inside a header, neither raised nor returned: the socket.timeout "
                       "(TimeoutError) must reach the caller; do not retry it, nor make the "
                       "socket blocking")
        if not isinstance(outcome[0], TimeoutError):
            raise Fail("recv_frame on a socket with a timeout, whose peer went silent, must let "
                       "the socket.timeout (TimeoutError) through", got=repr(outcome[0])[:80])
        check_equal(b.gettimeout(), 0.1, "the socket's timeout after recv_frame (the caller's "
                    "own: leave it as you found it)")
    finally:
        a.close()  # wakes a reader still blocked in recv()
        done.wait(scaled(5.0))
        b.close()


# The property test: any payload sizes, the stream cut anywhere (judge/properties.py: the same
# examples on every run; a failure is shrunk to a smallest stream, and the message shows it).
SIZES = st.one_of(st.integers(0, 600), st.sampled_from([255, 256, 65535, 65536, 70001]))
PATTERN = bytes(range(256))


@st.composite
def _streams(draw):
    sizes = draw(st.lists(SIZES, min_size=1, max_size=5))
    wire = sum(4 + n for n in sizes)
    cuts = draw(st.lists(st.integers(1, wire - 1), max_size=12, unique=True))
    return sizes, sorted(cuts)


def _payload(i: int, n: int) -> bytes:
    return (PATTERN * (n // 256 + 2))[i:i + n]


def _came_out(impl, payloads, pieces) -> list:
    """What recv_frame returns, frame after frame and once more, for the pieces trickled in."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    b.settimeout(scaled(2.0))
    t = _trickle(a, pieces, b)
    got = []
    try:
        for _ in range(len(payloads) + 1):
            got.append(impl.recv_frame(b))
    except Exception as exc:  # noqa: BLE001 - the message shows it
        got.append(f"{type(exc).__name__}: {exc}")
    finally:
        b.close()
        t.join()
    return got


def _sent(impl, payloads) -> bytes:
    """The bytes send_frame puts on the wire for the payloads, read by the judge."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    b.settimeout(scaled(5.0))
    try:
        with ThreadPoolExecutor(1) as pool:
            def read_all():
                chunks = []
                while chunk := b.recv(1 << 16):
                    chunks.append(chunk)
                return b"".join(chunks)
            reading = pool.submit(read_all)
            try:
                for p in payloads:
                    impl.send_frame(a, p)
            finally:
                a.shutdown(socket.SHUT_WR)
            return reading.result()
    finally:
        a.close()
        b.close()


def _short(x, other=None) -> str:
    """x in a few words; where x and other are bytes of one length, where they first differ."""
    if not isinstance(x, bytes):
        return repr(x)
    if isinstance(other, bytes) and len(other) == len(x) and other != x:
        at = next(i for i, (p, q) in enumerate(zip(x, other)) if p != q)
        return f"{len(x)} bytes, byte {at} = {x[at]}"
    return f"{len(x)} bytes"


@test(input="Hypothesis: 1 to 5 frames of any size (0 to 600 bytes, and 255, 256, 65535, 65536, "
            "70001), the stream cut at up to 12 byte offsets, each piece a recv() of its own; "
            "the same payloads through send_frame, read by the judge", timeout=120)
def any_sizes_any_splits(impl):
    def frames_survive(stream):
        sizes, cuts = stream
        payloads = [_payload(i, n) for i, n in enumerate(sizes)]
        wire = b"".join(struct.pack("!I", len(p)) + p for p in payloads)
        example = f"frames of {sizes} bytes"
        step(f"send_frame of {example}, read back by the judge")
        sent = _sent(impl, payloads)
        if sent != wire:
            at = next((i for i, (x, y) in enumerate(zip(sent, wire)) if x != y), min(len(sent), len(wire)))
            raise Fail(f"send_frame of {example}: the bytes on the wire differ from a 4-byte "
                       f"big-endian length then the payload, first at byte {at}",
                       expected=f"{len(wire)} bytes", got=f"{len(sent)} bytes")
        bounds = [0, *cuts, len(wire)]
        step(f"recv_frame of {example}, the stream cut at byte offsets {cuts}")
        got = _came_out(impl, payloads, [wire[x:y] for x, y in zip(bounds, bounds[1:])])
        if got != [*payloads, None]:
            i = next(i for i, (g, e) in enumerate(zip(got, [*payloads, None])) if g != e)
            what = f"frame {i}" if i < len(payloads) else "the call after the last frame"
            raise Fail(f"recv_frame of {example}, the stream cut at byte offsets {cuts} (each "
                       f"piece one recv()): {what} came out wrong",
                       expected=_short([*payloads, None][i], got[i]),
                       got=_short(got[i], [*payloads, None][i]))
    for_all(_streams(), frames_survive, examples=60, what="a stream (frame sizes, cut offsets)")
