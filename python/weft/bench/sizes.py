"""Message sizes as nccl-tests takes them: 8, 64K, 1M, 2G (powers of 1024)."""

from __future__ import annotations

import argparse
import re

SUFFIXES = {"": 0, "K": 10, "M": 20, "G": 30}
# --iter-bytes adds at most this many times -n calls.
MAX_ITERS_FACTOR = 20


def parse_size(text: str) -> int:
    """'8', '64K', '1M', '1MiB', '2G' -> bytes."""
    m = re.fullmatch(r"(\d+)\s*([KMG]?)(?:i?B)?", text.strip(), re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"bad size {text!r} (e.g. 8, 64K, 1M, 2G)")
    return int(m.group(1)) << SUFFIXES[m.group(2).upper()]


def sweep(begin: int, end: int, factor: int) -> list[int]:
    """begin, begin*factor, ... up to end inclusive (nccl-tests' -b/-e/-f)."""
    if begin <= 0 or end < begin:
        raise ValueError(f"need 0 < begin <= end, got {begin} and {end}")
    if factor < 2 and begin != end:
        raise ValueError("the step factor must be at least 2")
    sizes = [begin]
    while sizes[-1] * factor <= end:
        sizes.append(sizes[-1] * factor)
    return sizes


def human(nbytes: int) -> str:
    """8 B, 64 KiB, 1 MiB: the exact size in the largest unit that divides it."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


def timed_calls(plan: dict, nbytes: int) -> int:
    """-n, or at small sizes enough calls to move --iter-bytes (the same on every rank)."""
    wanted = -(-plan.get("iter_bytes", 0) // max(1, nbytes))
    return max(plan["iters"], min(wanted, MAX_ITERS_FACTOR * plan["iters"]))
