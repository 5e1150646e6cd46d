"""Scratch memory is shared by the communicators of a process and not kept beyond
WEFT_SCRATCH_CACHE_BYTES. Measured as the process's anonymous resident memory (shared-memory
FIFOs are not anonymous), around recursive-doubling allreduces, whose scratch is as large as
the message."""

from __future__ import annotations

import numpy as np
from weft_proc import Ranks

MIB = 1 << 20
CACHE = 64 * MIB
UNDER_CACHE = 48 * MIB
OVER_CACHE = 96 * MIB


def rss_anon() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no RssAnon in /proc/self/status")


def scenario_scratch(rank, size, store, under, over):
    import weft

    small = np.ones(under // 4, np.float32)
    large = np.ones(over // 4, np.float32)
    comms = [
        weft.Communicator(store, rank, size, name=name, algo="rd", timeout=60)
        for name in ("first", "second")
    ]
    before = rss_anon()
    for comm in comms:
        comm.allreduce(small)
    two_communicators = rss_anon() - before
    before = rss_anon()
    comms[0].allreduce(large)
    beyond_cache = rss_anon() - before
    return {
        "two_communicators": two_communicators,
        "beyond_cache": beyond_cache,
        "small": [float(small.min()), float(small.max())],
        "large": [float(large.min()), float(large.max())],
    }


def test_scratch_is_shared_and_bounded():
    env = {"WEFT_TRANSPORT": "shm", "WEFT_SCRATCH_CACHE_BYTES": str(CACHE)}
    with Ranks(scenario_scratch, 2, UNDER_CACHE, OVER_CACHE, env=env) as ranks:
        results = ranks.results(timeout=180)
    for rank, got in enumerate(results):
        assert got["small"] == [4.0, 4.0] and got["large"] == [2.0, 2.0], f"rank {rank}: {got}"
        # One scratch buffer serves both communicators: the second borrows the first's.
        assert got["two_communicators"] < 1.5 * UNDER_CACHE, (
            f"rank {rank}: two communicators grew anonymous memory by "
            f"{got['two_communicators'] / MIB:.0f} MiB for one {UNDER_CACHE // MIB} MiB scratch"
        )
        # Scratch beyond the cache is freed after the operation, and the smaller kept buffer
        # is dropped to stay within it.
        assert got["beyond_cache"] < 8 * MIB, (
            f"rank {rank}: a {OVER_CACHE // MIB} MiB operation left "
            f"{got['beyond_cache'] / MIB:.0f} MiB more anonymous memory (cache {CACHE // MIB} MiB)"
        )
