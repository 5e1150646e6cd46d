"""Timing loop shared by every system in the allreduce benchmark.

Each system (weft, gloo, OpenMPI) wraps its allreduce and barrier in a `Collective`; the same
`time_sizes` then runs on every rank, so all systems see the same buffers, the same
warm-up and the same iteration counts.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class Collective:
    allreduce: Callable[[Any], Any]  # in-place sum over all ranks of a wrapped buffer
    barrier: Callable[[], Any]
    wrap: Callable[[np.ndarray], Any] = lambda array: array  # numpy -> buffer type


def time_sizes(coll: Collective, rank: int, size: int, plan: list[dict]) -> list[dict]:
    """Times `coll.allreduce` once per entry of `plan` ({bytes, iterations, warmup}).

    Per size: one allreduce checked against the expected sum, `warmup` untimed calls, a
    barrier, then `iterations` timed calls. Returns this rank's elapsed seconds per size;
    the caller turns them into time per call (max over ranks, median over repeats).
    """
    expected = size * (size + 1) / 2  # rank r contributes r + 1
    out = []
    for entry in plan:
        array = np.empty(entry["bytes"] // 4, dtype=np.float32)
        buf = coll.wrap(array)
        array.fill(rank + 1)
        coll.allreduce(buf)
        check_ok = bool(np.all(array == expected))
        array.fill(0.0)  # zeros stay zeros however often they are summed
        for _ in range(entry["warmup"]):
            coll.allreduce(buf)
        coll.barrier()
        start = time.perf_counter()
        for _ in range(entry["iterations"]):
            coll.allreduce(buf)
        elapsed = time.perf_counter() - start
        out.append({"bytes": array.nbytes, "elapsed_s": elapsed, "check_ok": check_ok})
    coll.barrier()
    return out
