"""Finding the Ray cluster, before anything starts (vLLM: initialize_ray_cluster in
vllm/v1/executor/ray_utils.py, which calls ray.init and builds the placement group).

`--distributed-executor-backend ray` needs a running cluster; minivllm never starts one
itself, as vLLM does not on a multi-node cluster. check_ray_cluster runs while the config is
validated, so `minivllm serve` and `LLM(...)` fail at once, with the commands that fix it.
"""

from __future__ import annotations

import os
import socket

RAY_PIN = "ray==2.60.0"  # requirements.txt
RAY_ADDRESS_ENV = "RAY_ADDRESS"  # Ray's own variable (ray.init reads it too)
CONNECT_TIMEOUT_S = 3.0  # a TCP connect to the head's GCS port; a live head answers in ms
HOW_TO_START = (
    "start one: on the head node `ray start --head --port=6379 --num-cpus=<cores> "
    "--include-dashboard=false`, on every other node `ray start --address=<head ip>:6379 "
    "--num-cpus=<cores>`; then set RAY_ADDRESS=<head ip>:6379 or pass --ray-address")


def check_ray_cluster(address: str | None) -> str:
    """The cluster's address (address, else $RAY_ADDRESS), once Ray imports and its head
    accepts a TCP connection there; ValueError saying what to do otherwise."""
    try:
        import ray  # noqa: F401
    except ImportError:
        raise ValueError(f"the ray backend needs Ray: `pip install {RAY_PIN}` (the README's "
                         f"setup installs it), then {HOW_TO_START}") from None
    address = address or os.environ.get(RAY_ADDRESS_ENV)
    if not address:
        raise ValueError(f"the ray backend needs a running Ray cluster and its address: "
                         f"{HOW_TO_START}")
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"a Ray address is HOST:PORT (the head's GCS port), got {address!r}")
    try:
        socket.create_connection((host, int(port)), CONNECT_TIMEOUT_S).close()
    except OSError as e:
        raise ValueError(f"no Ray cluster answers at {address} ({e.strerror or e}): "
                         f"{HOW_TO_START}") from None
    return address
