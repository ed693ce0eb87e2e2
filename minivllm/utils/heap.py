"""Hand the heap's free pages back to the kernel once a model is loaded (glibc's malloc_trim).

A load frees much of what it allocated (the file's bytes read into buffers, the Q4 rows in the
file's layout once repacked), but glibc keeps freed heap memory mapped for later mallocs, and it
stays in the process's RSS: 30 MiB in the engine core serving the bundled model. malloc_trim(0)
releases every free page of the heap, also the ones between live allocations.
"""

from __future__ import annotations

import ctypes


def trim_heap() -> bool:
    """malloc_trim(0); False where the C library has none (musl, macOS)."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    trim(0)
    return True
