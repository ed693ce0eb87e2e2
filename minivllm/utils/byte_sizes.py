"""Byte counts as people write them on a command line: 512M, 1.5g, 2G, 1048576.

vLLM's rule (human_readable_int in vllm/utils/argparse_utils.py): a lower-case suffix is decimal
(k = 1000), an upper-case one binary (K = 1024), and a binary suffix takes whole numbers only.
"""

from __future__ import annotations

import argparse
import re

DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def parse_bytes(text: str) -> int:
    """'512M' -> 536870912, '1.5g' -> 1500000000, '4096' -> 4096; argparse's error otherwise."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT]?)", text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not a byte count: write e.g. 536870912, "
                                         f"512M (binary, 2**20) or 0.5g (decimal, 10**9)")
    number, suffix = match.groups()
    if suffix in BINARY:
        if "." in number:
            raise argparse.ArgumentTypeError(f"{text!r}: a binary suffix takes a whole number; "
                                             f"did you mean {number}{suffix.lower()}?")
        return int(number) * BINARY[suffix]
    if "." in number and not suffix:
        raise argparse.ArgumentTypeError(f"{text!r}: a byte count is a whole number")
    return int(float(number) * DECIMAL.get(suffix, 1))
