"""Reference answer of exercise 102."""

from __future__ import annotations


def serve_process_count(tp: int, dp: int, pp: int = 1, api_server_count: int | None = None) -> int:
    if min(tp, dp, pp) < 1:
        raise ValueError(f"tp={tp}, dp={dp}, pp={pp}: parallel sizes start at 1")
    api = dp if api_server_count is None else api_server_count
    # the CLI process stays as the parent of several API servers, or of the cores when headless (0)
    launcher = 1 if api != 1 else 0
    world = tp * pp  # workers of one engine core
    workers = dp * world if world > 1 else 0  # uni executor: the worker is in the engine core
    coordinator = 1 if dp > 1 and api > 0 else 0  # headless: the head node runs the coordinator
    return launcher + api + dp + workers + coordinator
