"""The environment variables that set minivllm's failure timing and addresses, read when used
(as vllm/envs.py reads its own). Where vLLM has the setting, the name is vLLM's:

    VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS  300   a step's deadline: the executor gives up on a
                                               worker's reply (vllm/envs.py:1863-1865)
    VLLM_HOST_IP                        ""    the address this node advertises to the others
                                               (IPv4 or IPv6; vllm/envs.py:724). "": minivllm
                                               takes this host's address on the route to the
                                               leader; vLLM's get_ip takes the one on the route
                                               to 8.8.8.8, then 2001:4860:4860::8888, then
                                               0.0.0.0 (vllm/utils/network_utils.py:52-91),
                                               which on a host whose default route is not the
                                               nodes' network names the wrong interface

vLLM has no heartbeats on its tcp connections; minivllm's (a ZMTP PING every interval, the
connection dropped after the timeout of silence) are set with:

    MINIVLLM_HEARTBEAT_INTERVAL_MS      1000
    MINIVLLM_HEARTBEAT_TIMEOUT_MS       3000

The process group's timeout is a flag: --distributed-timeout-seconds, else
--cpu-distributed-timeout-seconds (EngineConfig.collective_timeout_s).
"""

from __future__ import annotations

import os

EXECUTE_MODEL_TIMEOUT_ENV = "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS"
HOST_IP_ENV = "VLLM_HOST_IP"
HEARTBEAT_INTERVAL_ENV = "MINIVLLM_HEARTBEAT_INTERVAL_MS"
HEARTBEAT_TIMEOUT_ENV = "MINIVLLM_HEARTBEAT_TIMEOUT_MS"


def _positive(name: str, default: int) -> int:
    raw = os.environ.get(name, "")
    try:
        value = int(raw) if raw else default
    except ValueError:
        raise ValueError(f"{name} must be a whole number, got {raw!r}") from None
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {value}")
    return value


def execute_model_timeout_s() -> int:
    return _positive(EXECUTE_MODEL_TIMEOUT_ENV, 300)


def host_ip() -> str:
    return os.environ.get(HOST_IP_ENV, "").strip()


def heartbeat_ms() -> tuple[int, int]:
    """(interval, timeout) in milliseconds."""
    return (_positive(HEARTBEAT_INTERVAL_ENV, 1000), _positive(HEARTBEAT_TIMEOUT_ENV, 3000))
