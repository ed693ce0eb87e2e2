"""The judge's tests for exercise 121. Each receives the learner's module as `impl`."""

import fcntl
import socket
import struct
import termios
import threading
import time

from minivllm.judge.api import Fail, check_equal, test


def _pair():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    b.settimeout(5)  # a recv that waits for bytes that never come fails, not hangs
    return a, b


PIECES = (1, 1, 1, 1, 7, 997)  # bytes per send(), in turn: headers arrive a byte at a time


def _queued(sock) -> int:
    return int.from_bytes(fcntl.ioctl(sock.fileno(), termios.FIONREAD, bytes(4)), "little")


def _trickle(sock, data, reader, close=True):
    """Send `data` in small pieces from a thread, each only once the reader has taken the last
    one: every recv() sees exactly one piece, whatever the machine's speed or load."""
    def run():
        try:
            i, k = 0, 0
            while i < len(data):
                piece = data[i:i + PIECES[k % len(PIECES)]]
                sock.sendall(piece)
                i, k = i + len(piece), k + 1
                while _queued(reader):
                    time.sleep(0.0002)
        except OSError:
            pass  # the reader gave up and closed its end
        finally:
            if close:
                sock.close()
    t = threading.Thread(target=run)
    t.start()
    return t


@test(input="frames b'hello' and b'' sent with send_frame, read with recv_frame")
def round_trip(impl):
    a, b = _pair()
    try:
        impl.send_frame(a, b"hello")
        impl.send_frame(a, b"")
        check_equal(b.recv(4), struct.pack("!I", 5), "the header on the wire (4 bytes, big-endian)")
        check_equal(b.recv(5), b"hello", "the payload after the header")
        check_equal(impl.recv_frame(b), b"", "an empty frame")
    finally:
        a.close()
        b.close()


@test(input="3 frames (1000 B, 0 B, 70000 B) arriving in pieces of 1 to 997 bytes, then a clean close",
      hang="recv_frame waits for bytes that are not coming: is recv_exact asking for the right count?")
def partial_reads(impl):
    a, b = _pair()
    frames = [bytes(range(256)) * 4, b"", b"x" * 70000]
    wire = b"".join(struct.pack("!I", len(f)) + f for f in frames)
    t = _trickle(a, wire, b)
    try:
        for i, f in enumerate(frames):
            try:
                got = impl.recv_frame(b)
            except Exception as exc:
                raise Fail(f"frame {i} failed: a recv() may return fewer bytes than asked, so read "
                           "in a loop until you have them all", got=repr(exc),
                           input="pieces of 1, 1, 1, 1, 7 and 997 bytes per recv()")
            if got != f:
                raise Fail(f"frame {i} came out wrong: a recv() may return fewer bytes than asked",
                           expected=f"{len(f)} bytes", got=f"{len(got) if got is not None else None} bytes",
                           input="pieces of 1, 1, 1, 1, 7 and 997 bytes per recv()")
        check_equal(impl.recv_frame(b), None, "recv_frame after the peer closed between frames")
    finally:
        b.close()  # first, so that a blocked sender fails instead of waiting forever
        t.join()


@test(input="two frames glued into one send()")
def glued_frames(impl):
    a, b = _pair()
    try:
        a.sendall(struct.pack("!I", 3) + b"abc" + struct.pack("!I", 2) + b"de")
        check_equal([impl.recv_frame(b), impl.recv_frame(b)], [b"abc", b"de"], "two frames from one send")
    finally:
        a.close()
        b.close()


@test(input="a header saying 10 bytes, then 4 bytes, then close; and a close after 2 header bytes",
      timeout=4, hang="a loop that keeps calling recv() after it returned b\"\" (EOF) never ends")
def close_inside_a_frame(impl):
    for wire, where in [(struct.pack("!I", 10) + b"abcd", "inside the payload"),
                        (b"\x00\x00", "inside the header")]:
        a, b = _pair()
        a.sendall(wire)
        a.close()
        try:
            impl.recv_frame(b)
        except ConnectionError:
            continue
        except Exception as e:
            raise Fail(f"a close {where} must raise ConnectionError", got=repr(e), input=repr(wire))
        finally:
            b.close()
        raise Fail(f"a close {where} must raise ConnectionError, not return", input=repr(wire))


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
