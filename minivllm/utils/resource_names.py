"""Names for what minivllm creates outside its own memory: /dev/shm segments and private
directories (where its ipc:// socket files live: utils/run_dir.py, utils/zmq.py).

Every such name starts with one prefix, taken from the environment variable
MINIVLLM_RESOURCE_PREFIX ("minivllm" when unset), then a tag and a random part:

    /dev/shm/minivllm-ring-3f9a0c1b2d4e          shm_name("ring")
    $TMPDIR/minivllm-run4242-x8k2/               private_dir("run4242")

The test suite and the judge give each test its own prefix (and its own TMPDIR), so a leak
check can tell what the test made from what another program on the machine made at the same
time, and never touches the latter. Children inherit the variable, so a worker process names
its resources with its parent's prefix.
"""

from __future__ import annotations

import os
import secrets
import tempfile
from multiprocessing import shared_memory

PREFIX_ENV = "MINIVLLM_RESOURCE_PREFIX"
DEFAULT_PREFIX = "minivllm"
RANDOM_HEX = 12  # 48 random bits: no collision between the names of one run


def resource_prefix() -> str:
    return os.environ.get(PREFIX_ENV) or DEFAULT_PREFIX


def unique_name(tag: str) -> str:
    """prefix-tag-random: a fresh name that the leak checks attribute to this prefix."""
    return f"{resource_prefix()}-{tag}-{secrets.token_hex(RANDOM_HEX // 2)}"


def shm_name(tag: str) -> str:
    """A fresh /dev/shm segment name (no leading slash), for SharedMemory(name=..., create=True)."""
    return unique_name(tag)


def private_dir(tag: str) -> str:
    """A fresh directory (mode 0700) in the temp dir; the caller removes it."""
    return tempfile.mkdtemp(prefix=f"{resource_prefix()}-{tag}-")


def has_prefix(name: str, prefix: str) -> bool:
    """Whether a segment name or a path's last component was made under `prefix`."""
    return os.path.basename(name.rstrip("/")).startswith(prefix + "-")


def name_default_segments() -> None:
    """Make SharedMemory(create=True) without a name use the prefix too, in this process and
    the processes it forks (the test suite and the judge call this; plain code need not)."""
    shared_memory._make_filename = lambda: "/" + unique_name("psm")
