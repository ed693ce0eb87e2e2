"""The judge's tests for exercise 121. Each receives the learner's module as `fr`."""

import socket
import struct
import threading

from minivllm.judge.api import Fail, check_equal, test


def _pair():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    b.settimeout(5)  # a recv that waits for bytes that never come fails, not hangs
    return a, b


def _trickle(sock, data, close=True):
    """Send `data` one byte per send() in a thread: every recv sees a partial read."""
    def run():
        try:
            for i in range(len(data)):
                sock.send(data[i:i + 1])
        except OSError:
            pass  # the reader gave up and closed its end
        finally:
            if close:
                sock.close()
    t = threading.Thread(target=run)
    t.start()
    return t


@test(input="frames b'hello' and b'' sent with send_frame, read with recv_frame")
def round_trip(fr):
    a, b = _pair()
    try:
        fr.send_frame(a, b"hello")
        fr.send_frame(a, b"")
        check_equal(b.recv(4), struct.pack("!I", 5), "the header on the wire (4 bytes, big-endian)")
        check_equal(b.recv(5), b"hello", "the payload after the header")
        check_equal(fr.recv_frame(b), b"", "an empty frame")
    finally:
        a.close()
        b.close()


@test(input="3 frames (1000 B, 0 B, 70000 B) arriving one byte per recv, then a clean close",
      hang="recv_frame waits for bytes that are not coming: is recv_exact asking for the right count?")
def partial_reads(fr):
    a, b = _pair()
    frames = [bytes(range(256)) * 4, b"", b"x" * 70000]
    wire = b"".join(struct.pack("!I", len(f)) + f for f in frames)
    t = _trickle(a, wire)
    try:
        for i, f in enumerate(frames):
            got = fr.recv_frame(b)
            if got != f:
                raise Fail(f"frame {i} came out wrong: a recv() may return fewer bytes than asked",
                           expected=f"{len(f)} bytes", got=f"{len(got) if got is not None else None} bytes",
                           input="one byte per recv()")
        check_equal(fr.recv_frame(b), None, "recv_frame after the peer closed between frames")
    finally:
        b.close()  # first, so that a blocked sender fails instead of waiting forever
        t.join()


@test(input="two frames glued into one send()")
def glued_frames(fr):
    a, b = _pair()
    try:
        a.sendall(struct.pack("!I", 3) + b"abc" + struct.pack("!I", 2) + b"de")
        check_equal([fr.recv_frame(b), fr.recv_frame(b)], [b"abc", b"de"], "two frames from one send")
    finally:
        a.close()
        b.close()


@test(input="a header saying 10 bytes, then 4 bytes, then close; and a close after 2 header bytes",
      timeout=4, hang="a loop that keeps calling recv() after it returned b\"\" (EOF) never ends")
def close_inside_a_frame(fr):
    for wire, where in [(struct.pack("!I", 10) + b"abcd", "inside the payload"),
                        (b"\x00\x00", "inside the header")]:
        a, b = _pair()
        a.sendall(wire)
        a.close()
        try:
            fr.recv_frame(b)
        except ConnectionError:
            continue
        except Exception as e:
            raise Fail(f"a close {where} must raise ConnectionError", got=repr(e), input=repr(wire))
        finally:
            b.close()
        raise Fail(f"a close {where} must raise ConnectionError, not return", input=repr(wire))
