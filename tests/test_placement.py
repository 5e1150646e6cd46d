"""Ranks that outnumber the CPUs they may use spread evenly over them: a host's rank i goes to
the (i mod n)-th CPU of its allowed set when its communicator is created, and back there when a
crowded wait finds it elsewhere (left alone, the kernel kept 4 ranks on 2 CPUs 3 + 1 for whole
runs in half the launches). Nothing is pinned: the allowed set stays what it was."""

from __future__ import annotations

import os

import numpy as np
import pytest
from weft_proc import Ranks

ALLOWED = sorted(os.sched_getaffinity(0))


def on_cpu() -> int:
    """The CPU this thread last ran on (the "processor" field of /proc's stat)."""
    with open("/proc/thread-self/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[36])


def scenario_spread(rank, size, store, samples):
    import weft

    comm = weft.Communicator(store, rank, size, timeout=60)
    x = np.ones(2, np.float32)
    seen = []
    for _ in range(samples):
        for _ in range(200):
            comm.allreduce(x)
        seen.append(on_cpu())
    return {"cpus": seen, "allowed": sorted(os.sched_getaffinity(0))}


@pytest.mark.skipif(
    not 2 <= len(ALLOWED) <= 4,
    reason=f"needs 2 to 4 usable CPUs for twice as many ranks (this process has {len(ALLOWED)})",
)
def test_ranks_outnumbering_cpus_spread_evenly_over_them():
    size = 2 * len(ALLOWED)
    with Ranks(scenario_spread, size, 20) as ranks:
        seen = ranks.results(timeout=180)
    for rank, got in enumerate(seen):
        assert got["allowed"] == ALLOWED, f"rank {rank} was left pinned: {got['allowed']}"
        want = ALLOWED[rank % len(ALLOWED)]
        share = sum(cpu == want for cpu in got["cpus"]) / len(got["cpus"])
        assert share >= 0.8, (
            f"rank {rank} was on CPU {want} in {share:.0%} of the samples, "
            f"on these CPUs: {got['cpus']}"
        )
