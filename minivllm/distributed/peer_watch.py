"""PeerWatch: hear when the peer at the other end of a ZMQ TCP connection is gone.

Across machines there is no sentinel and no pidfd: a process cannot wait for another host's
process to exit. What crosses is the TCP connection, so that is what we watch:

- the peer's process dies (kill -9 included): its kernel closes the connection (FIN/RST),
  and libzmq reports EVENT_DISCONNECTED on a socket monitor within milliseconds;
- the peer's host or link vanishes (no FIN ever comes): the ZMTP heartbeat that every tcp
  reader of a MessageQueue asks for (shm_broadcast.HEARTBEAT_*: a PING every interval, the
  connection dropped after HEARTBEAT_TIMEOUT_MS of silence) turns the silence into the same
  EVENT_DISCONNECTED. libzmq answers PINGs from its own I/O thread, so a peer busy in Python
  (or holding the GIL) still answers: a slow peer is not taken for a dead one.

One thread polls the monitor sockets of the watched sockets and calls on_lost(key, endpoint)
once, for the first disconnect. stop() ends the watch; call it before the watched sockets'
context is terminated (a monitor socket left open would block zmq's context.term()).
"""

from __future__ import annotations

import itertools
import os
import threading
from typing import Any, Callable

import zmq
from zmq.utils.monitor import recv_monitor_message

POLL_MS = 100  # how often the watch thread looks at its stop flag
_monitor_ids = itertools.count()


def _monitor_socket(sock: zmq.Socket) -> zmq.Socket:
    """A blocking PAIR that receives `sock`'s disconnect events, also when `sock` is a
    zmq.asyncio socket (whose own get_monitor_socket would hand back an asyncio socket)."""
    address = f"inproc://minivllm-peer-watch-{os.getpid()}-{next(_monitor_ids)}"
    sock.monitor(address, zmq.EVENT_DISCONNECTED)
    monitor = zmq.Context.shadow(sock.context.underlying).socket(zmq.PAIR)
    monitor.connect(address)
    return monitor


class PeerWatch:
    def __init__(self, sockets: dict[Any, zmq.Socket], on_lost: Callable[[Any, str], None],
                 name: str = "PeerWatch") -> None:
        self.on_lost, self.stopped = on_lost, threading.Event()
        self._watched = list(sockets.values())
        self._monitors = {_monitor_socket(sock): key for key, sock in sockets.items()}
        self._thread = threading.Thread(target=self._run, daemon=True, name=name)
        self._thread.start()

    def _run(self) -> None:
        poller = zmq.Poller()
        for monitor in self._monitors:
            poller.register(monitor, zmq.POLLIN)
        while not self.stopped.is_set():
            for monitor, _ in poller.poll(POLL_MS):
                event = recv_monitor_message(monitor)
                if event["event"] == zmq.EVENT_DISCONNECTED and not self.stopped.is_set():
                    self.on_lost(self._monitors[monitor], event["endpoint"].decode())
                    return

    def stop(self) -> None:
        """End the watch and close the monitor sockets. Idempotent; any thread but the
        watch's own (from on_lost it only sets the flag)."""
        self.stopped.set()
        if threading.current_thread() is self._thread:
            return
        self._thread.join()
        for sock in self._watched:
            try:
                sock.disable_monitor()
            except zmq.ZMQError:
                pass  # already closed
        for monitor in self._monitors:
            monitor.close(linger=0)
        self._monitors = {}
