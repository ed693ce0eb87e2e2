"""ping, in Python (the machine may have no ping binary): ICMP echo requests over a raw
socket (root), one JSON line of round-trip times in milliseconds.

    python -m minivllm.utils.icmp_ping ADDRESS COUNT   # -> {"rtt_ms": [...], "lost": n}
"""

from __future__ import annotations

import json
import os
import socket
import struct
import sys
import time

ECHO_REQUEST, ECHO_REPLY = 8, 0
REPLY_TIMEOUT_S = 2.0  # a reply later than this counts as lost
INTERVAL_S = 0.05  # between requests: ping -i 0.05 (root may go below 0.2 s)
PAYLOAD = b"minivllm" * 7  # 56 bytes, ping's default


def checksum(data: bytes) -> int:
    """The Internet checksum (RFC 1071): ones' complement of the ones' complement sum."""
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    total = (total >> 16) + (total & 0xFFFF)
    total += total >> 16
    return ~total & 0xFFFF


def echo_request(ident: int, seq: int) -> bytes:
    header = struct.pack("!BBHHH", ECHO_REQUEST, 0, 0, ident, seq)
    return struct.pack("!BBHHH", ECHO_REQUEST, 0, checksum(header + PAYLOAD), ident,
                       seq) + PAYLOAD


def wait_reply(sock: socket.socket, ident: int, seq: int, deadline: float) -> bool:
    """True once the echo reply (ident, seq) arrives before the deadline."""
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            packet = sock.recv(2048)
        except socket.timeout:
            return False
        icmp = packet[(packet[0] & 0x0F) * 4:]  # past the IP header
        kind, _, _, rid, rseq = struct.unpack("!BBHHH", icmp[:8])
        if (kind, rid, rseq) == (ECHO_REPLY, ident, seq):
            return True
    return False


def ping(address: str, count: int) -> dict:
    ident = os.getpid() & 0xFFFF
    rtts = []
    with socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP) as sock:
        for seq in range(count):
            sent = time.monotonic()
            sock.sendto(echo_request(ident, seq), (address, 0))
            if wait_reply(sock, ident, seq, sent + REPLY_TIMEOUT_S):
                rtts.append((time.monotonic() - sent) * 1000)
            time.sleep(INTERVAL_S)
    return {"rtt_ms": rtts, "lost": count - len(rtts)}


if __name__ == "__main__":
    print(json.dumps(ping(sys.argv[1], int(sys.argv[2]))))
