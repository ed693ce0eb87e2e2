"""`minivllm serve` as a child process: for the benchmark, the tests and chapter 09.

    with ServerProcess(["/path/to/model", "--max-num-seqs", "32"]) as server:
        openai.OpenAI(base_url=server.url + "/v1", api_key="none")...
    server.returncode   # 0 after a clean stop

It picks a free port, waits until /health answers 200 (or the child exits, or the timeout),
keeps the child's output in a log file, and stops it with SIGTERM, then SIGKILL.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

START_TIMEOUT_S = 180.0  # loading a model and building the C ops on a busy 2-core machine
STOP_TIMEOUT_S = 30.0  # SIGTERM to exit: the engine's shutdown escalates within this


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_status(url: str, timeout: float = 2.0) -> int | None:
    """The status of a GET, or None when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


class ServerProcess:
    def __init__(self, args: list[str] | None = None, port: int | None = None,
                 env: dict[str, str] | None = None, start_timeout: float = START_TIMEOUT_S
                 ) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.TemporaryFile(mode="w+")
        cmd = [sys.executable, "-m", "minivllm.cli", "serve", *(args or []),
               "--port", str(self.port)]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     env={**os.environ, **(env or {})})
        try:
            self.wait_healthy(start_timeout)
        except BaseException:
            self.stop()
            raise

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return self.proc.poll()

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"minivllm serve exited with code {self.proc.returncode}:\n"
                                   f"{self.output()[-3000:]}")
            if http_status(self.url + "/health") == 200:
                return
            time.sleep(0.2)
        raise TimeoutError(f"minivllm serve was not healthy within {timeout:g} s:\n"
                           f"{self.output()[-3000:]}")

    def wait(self, timeout: float) -> int | None:
        """The exit code, or None if the server still runs after `timeout` s."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM (a graceful exit), then SIGKILL; returns the exit code. Idempotent."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            if self.wait(timeout) is None:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def __enter__(self) -> "ServerProcess":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self.log.close()
