"""Exercise 102: the process count of `serve`. Read README.md in this folder.

Replace the `raise NotImplementedError` and grade with: python judge.py 102
"""

from __future__ import annotations


def serve_process_count(tp: int, dp: int, pp: int = 1, api_server_count: int | None = None) -> int:
    # TODO: API servers + engine cores + worker processes + DP coordinator
    raise NotImplementedError
