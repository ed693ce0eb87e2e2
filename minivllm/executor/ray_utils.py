"""Finding the Ray cluster and the placement group (vLLM: initialize_ray_cluster in
vllm/v1/executor/ray_utils.py:266-384, which calls ray.init and builds or takes the group).

Where the cluster is, in vLLM's order (ray.init's own, ray_utils.py:321):
  - `--ray-address HOST:PORT` (minivllm's flag; vLLM has none), else $RAY_ADDRESS;
  - inside a Ray actor or driver: the cluster it belongs to (vLLM: is_in_ray_actor in
    arg_utils.py:2373-2378, RAY_ADDRESS passed to the engine's process in
    utils/system_utils.py:131-137);
  - else ray.init()'s default: the cluster last started on this node by `ray start`
    ($RAY_TMPDIR or $TMPDIR or /tmp, then ray/ray_current_cluster), else a new local instance,
    which the executor stops again at shutdown.
An address given (flag or variable) is checked while the config is validated, so `minivllm
serve` and `LLM(...)` fail at once if no head answers there, with the commands that fix it.

The placement group: the config's, else the one this Ray actor runs in (vLLM:
ray_utils.py:330-333), else a new one of one {"CPU": 1} bundle per rank, PACK
(ray_utils.py:371-378; CPU is minivllm's device, as GPU is vLLM's).
"""

from __future__ import annotations

import os
import socket
from typing import Any

RAY_PIN = "ray==2.60.0"  # requirements.txt
RAY_ADDRESS_ENV = "RAY_ADDRESS"  # Ray's own variable (ray.init reads it too)
CONNECT_TIMEOUT_S = 3.0  # a TCP connect to the head's GCS port; a live head answers in ms
# a local instance's object store: minivllm passes nothing through it, so Ray's minimum
# (75 MiB, ray_constants.OBJECT_STORE_MINIMUM_MEMORY_BYTES) and a little
LOCAL_OBJECT_STORE_BYTES = 80 * 2**20
DEVICE_KEY = "CPU"  # the resource one rank takes (vLLM: current_platform.ray_device_key)
HOW_TO_START = (
    "start one: on the head node `ray start --head --port=6379 --num-cpus=<cores> "
    "--include-dashboard=false`, on every other node `ray start --address=<head ip>:6379 "
    "--num-cpus=<cores>`; then run on the head node, or set RAY_ADDRESS=<head ip>:6379, or "
    "pass --ray-address")


def check_ray_cluster(address: str | None) -> str | None:
    """The cluster's address for the engine's process: address, else $RAY_ADDRESS (once its
    head accepts a TCP connection), else the cluster this process already joined; None leaves
    it to ray.init's default. ValueError saying what to do otherwise."""
    try:
        import ray
    except ImportError:
        raise ValueError(f"the ray backend needs Ray: `pip install {RAY_PIN}` (the README's "
                         f"setup installs it), then {HOW_TO_START}") from None
    address = address or os.environ.get(RAY_ADDRESS_ENV)
    if not address:
        return ray.get_runtime_context().gcs_address if ray.is_initialized() else None
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"a Ray address is HOST:PORT (the head's GCS port), got {address!r}")
    try:
        socket.create_connection((host.strip("[]"), int(port)), CONNECT_TIMEOUT_S).close()
    except OSError as e:
        raise ValueError(f"no Ray cluster answers at {address} ({e.strerror or e}): "
                         f"{HOW_TO_START}") from None
    return address


def local_instance_args(address: str | None) -> dict[str, Any]:
    """ray.init's sizes for a local instance it would start: an explicit object store. Left
    to Ray, it is 30% of the memory free at that moment, capped by /dev/shm's free space, and
    on a machine another run is filling that falls below Ray's minimum: ray.init raises
    ValueError. Nothing when ray.init joins a cluster (which refuses sizes), found as ray.init
    finds it (ray._private.services, Ray pinned at RAY_PIN)."""
    from ray._private.services import canonicalize_bootstrap_address
    if canonicalize_bootstrap_address(address) is not None:
        return {}
    return {"object_store_memory": LOCAL_OBJECT_STORE_BYTES}


def current_placement_group() -> Any:
    """The placement group this process's Ray actor was placed in, else None (vLLM takes it
    only in an actor: arg_utils.py:2373-2378); never starts Ray."""
    try:
        import ray
    except ImportError:
        return None
    if not ray.is_initialized() or ray.get_runtime_context().get_actor_id() is None:
        return None
    return ray.util.get_current_placement_group()


def rank_bundles(pg: Any, world_size: int) -> list[int]:
    """The indices of the bundles that can hold a rank (at least one CPU); ValueError when
    there are fewer than world_size (vLLM: ray_utils.py:339-356)."""
    found = [i for i, b in enumerate(pg.bundle_specs) if b.get(DEVICE_KEY, 0) >= 1]
    if len(found) < world_size:
        raise ValueError(f"the placement group has {len(found)} bundle(s) with a {DEVICE_KEY} "
                         f"({pg.bundle_specs}), tensor_parallel_size={world_size} needs "
                         f"{world_size}: one {{'{DEVICE_KEY}': 1}} bundle per rank")
    return found


def bundles_sorted_by_node(pg: Any, bundles: list[int], driver_node: str) -> list[tuple[int, str]]:
    """(bundle index, node id) of the given bundles, the driver's node first, then by node id:
    rank r takes the r-th (vLLM: get_bundles_sorted_by_node, ray_utils.py:141-198)."""
    from ray.util import placement_group_table
    bundle_node = placement_group_table(pg)["bundles_to_node_id"]
    placed = [(b, bundle_node[b]) for b in bundles]
    return sorted(placed, key=lambda item: (item[1] != driver_node, item[1], item[0]))
