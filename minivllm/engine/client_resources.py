"""What an MP client must release, held apart from the client so that nothing here refers
back to it. The client's threads hold only a weak reference to the client, and a
weakref.finalize releases these when a dropped client is collected: re-running
`llm = LLM(...)` in a notebook stops the previous engine instead of leaving it running until
the kernel exits. vLLM does the same with BackgroundResources
(vllm/v1/engine/core_client.py (BackgroundResources), finalizer MPClient.__init__, weak monitor MPClient.start_engine_core_monitor).
"""

from __future__ import annotations

import os
import threading
from typing import Any, Callable

import zmq

from minivllm.utils.zmq import close_all

JOIN_S = 5.0  # a client thread leaves within this once told to (they block only in poll)


class ClientResources:
    def __init__(self, ctx: zmq.Context) -> None:
        self.ctx = ctx
        self.input_socket: zmq.Socket | None = None
        self.output_socket: zmq.Socket | None = None
        self.engine_manager: Any = None  # CoreEngineProcManager, when this client started them
        self.owned_fds: list[int] = []  # pidfds of engines another process started
        self.stop_r, self.stop_w = os.pipe()  # written once: the monitor thread leaves
        self.threads: list[threading.Thread] = []
        self.stoppers: list[Callable[[], None]] = []  # tell the other threads to leave
        self.after_threads: list[zmq.Socket] = []  # closed once the threads are gone
        self.owner_pid = os.getpid()  # a forked child's copy must not stop the parent's engines

    def release(self) -> None:
        """Stop the threads, close the sockets, stop the engines. Call once (a finalizer)."""
        if os.getpid() != self.owner_pid:
            return
        if threading.current_thread() in self.threads:
            # The last reference to the client died in one of its own threads, which this
            # must join: release from a thread of its own instead.
            threading.Thread(target=self.release, daemon=True, name="ClientRelease").start()
            return
        os.write(self.stop_w, b"x")
        for stop in self.stoppers:
            stop()
        for t in self.threads:
            t.join(JOIN_S)
        close_all(*self.after_threads, self.input_socket, self.output_socket)
        os.close(self.stop_r)
        os.close(self.stop_w)
        if self.engine_manager is not None:
            self.engine_manager.close()
        for fd in self.owned_fds:
            os.close(fd)
        self.owned_fds = []
        if not self.ctx.closed:
            self.ctx.term()
