"""The wire: an Ethernet link with a fixed delay, in user space, for kernels without netem.

    host i's netns     eth0  (TAP) ──┐                    ┌── h<i> (TAP, a port of br0)
                                     └── the wire process ┘   in the switch's netns
        frames eth0 -> h<i>: held delay_ms in a heap of (due, seq, frame), then written
        frames h<i> -> eth0: written at once

`tc qdisc ... netem delay D` on a host's eth0 delays what the host sends (netem_missing()
says whether this kernel has it); the wire does the same to the frames it carries out of the
host, so a round trip between two delayed hosts gains 2 x D either way (utils/netns_cluster.py
uses netem where the kernel has it: delay_method()). Every TCP connection, ARP and ping
crosses it unchanged: it is a link, not a proxy.

Timing: a frame is never written before its due time (the lower bound a test may rely on).
The wire runs at a real-time priority where it may (run_in_time), and select() sleeps with
microsecond resolution (poll and epoll round up to milliseconds), so a frame leaves a few tens
of microseconds late. Frames keep their order (equal delays, and seq breaks ties).

One process carries every link of a cluster. It runs in the switch's network namespace and
opens each host's TAP there with setns (a TAP is made in the namespace of the thread that
opens it). Its stdin is a pipe from the cluster's owner: a line there sets a new delay (in
ms, for frames read from then on), and EOF ends the wire, so it ends with its owner, also
after a SIGKILL; the TAPs die with its file descriptors.

    python -m minivllm.utils.netns_wire DELAY_MS HOST_NETNS_PATH...   # prints "ready"
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import heapq
import os
import select
import shutil
import struct
import subprocess
import sys
import time
from contextlib import contextmanager

TUNSETIFF = 0x400454CA  # _IOW('T', 202, int): attach this fd to a named TAP, made if missing
IFF_TAP = 0x0002  # Ethernet frames (IFF_TUN would carry bare IP packets)
IFF_NO_PI = 0x1000  # no 4-byte packet-info header before each frame
CLONE_NEWNET = 0x40000000
WIRE_PRIORITY = 1  # the lowest SCHED_FIFO priority: above every ordinary process, so a
# frame leaves when due instead of when the loaded scheduler next runs the wire
FRAME_MAX = 65536  # a TAP without offloads hands over one frame of at most the MTU
HOST_SIDE, SWITCH_SIDE = "eth0", "h{i}"  # names as netns_cluster's veth pairs have them


def netem_missing() -> str | None:
    """Why `tc qdisc ... netem` cannot delay a link here (None: it can, and a delayed
    NetnsCluster uses it); tried on the lo of a throwaway network namespace."""
    if os.geteuid() != 0 or shutil.which("tc") is None:
        return "tc netem needs root and the 'tc' command (package iproute2)"
    r = subprocess.run(["unshare", "--net", "tc", "qdisc", "add", "dev", "lo", "root", "netem",
                        "delay", "1ms"], capture_output=True, text=True)
    if r.returncode:
        return f"this kernel has no netem qdisc (sch_netem): {r.stderr.strip()}"
    return None


def delay_method() -> str:
    """How this machine delays a link: "tc netem" where the kernel has it, else "wire"."""
    return "wire" if netem_missing() else "tc netem"


def run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    """An ip or tc command; with check, RuntimeError with its message if it fails."""
    r = subprocess.run(cmd, capture_output=True, text=True)
    if check and r.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed: {r.stderr.strip()}")
    return r


def tc(netns: str, *args: str) -> None:
    """`tc -n netns args...`."""
    run("tc", "-n", netns, *args)


def unavailable() -> str | None:
    """Why a wire cannot be made here (None: it can)."""
    if not os.path.exists("/dev/net/tun"):
        return "/dev/net/tun is missing (load the tun module, or give the container the device)"
    return None


@contextmanager
def in_netns(path: str):
    """This thread in the network namespace bound at path, then back where it was."""
    libc = ctypes.CDLL(None, use_errno=True)
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(target, CLONE_NEWNET):
            raise OSError(ctypes.get_errno(), f"setns into {path}")
        yield
    finally:
        libc.setns(home, CLONE_NEWNET)
        os.close(home)
        os.close(target)


def open_tap(name: str) -> int:
    """A TAP named `name` in this thread's network namespace; it lives while the fd is open."""
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TAP | IFF_NO_PI))
    return fd


def write_frame(fd: int, frame: bytes) -> None:
    """Hand a frame to the kernel; a link set down (EIO) or a full queue drops it, as a wire
    drops what reaches a dead port."""
    try:
        os.write(fd, frame)
    except OSError as e:
        if e.errno not in (errno.EIO, errno.EAGAIN, errno.ENOBUFS):
            raise


def drain(fd: int) -> list[bytes]:
    """Every frame waiting on fd now."""
    frames = []
    while True:
        try:
            frames.append(os.read(fd, FRAME_MAX))
        except BlockingIOError:
            return frames


def carry(delay_s: float, links: list[tuple[int, int]], control: int) -> None:
    """Forward frames between each (host_fd, switch_fd) pair until `control` reads EOF; a
    line on it sets a new delay in ms (acknowledged on stdout: "delay <ms>")."""
    out = {}  # fd a frame was read from -> [fd it goes to, its delay]
    for host_fd, switch_fd in links:
        out[host_fd] = [switch_fd, delay_s]
        out[switch_fd] = [host_fd, 0.0]
    held: list[tuple[float, int, int, bytes]] = []  # (due, seq, to_fd, frame)
    seq, commands = 0, b""
    while True:
        timeout = max(0.0, held[0][0] - time.monotonic()) if held else None
        ready, _, _ = select.select([control, *out], [], [], timeout)
        now = time.monotonic()
        for fd in ready:
            if fd == control:
                if not (data := os.read(control, 4096)):
                    return
                *lines, commands = (commands + data).split(b"\n")
                for line in lines:
                    for host_fd, _ in links:
                        out[host_fd][1] = float(line) / 1000
                    print(f"delay {float(line):g}", flush=True)
                continue
            to_fd, delay = out[fd]
            for frame in drain(fd):
                if delay:
                    heapq.heappush(held, (now + delay, seq, to_fd, frame))
                    seq += 1
                else:
                    write_frame(to_fd, frame)
        while held and held[0][0] <= time.monotonic():
            _, _, to_fd, frame = heapq.heappop(held)
            write_frame(to_fd, frame)


def run_in_time() -> None:
    """SCHED_FIFO where this process may (root with CAP_SYS_NICE): the wire sleeps in
    select() nearly always, and wakes ahead of the load. Without it, frames still never leave
    early; they may leave later under load."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(WIRE_PRIORITY))
    except PermissionError:
        pass


def main(argv: list[str]) -> int:
    delay_ms, hosts = float(argv[0]), argv[1:]
    run_in_time()
    links = []
    for i, path in enumerate(hosts):
        with in_netns(path):
            host_fd = open_tap(HOST_SIDE)
        links.append((host_fd, open_tap(SWITCH_SIDE.format(i=i))))
    print("ready", flush=True)
    carry(delay_ms / 1000, links, sys.stdin.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
