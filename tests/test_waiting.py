"""A rank that waits long on shared memory sleeps until its peer's message wakes it.

Rank 0 comes to each allreduce late; rank 1 waits for it. Sleeping blind, rank 1 would wake
after every nap (about 700 times in 0.3 s: 50 us naps for 20 ms, then 1 ms ones) and start up
to a nap's length after rank 0's message arrived. On shared memory the sender rings the FIFO's
doorbell, so rank 1 wakes once the message is there and otherwise about every 10 ms.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

LATE_S = 0.3
ROUNDS = 5


def voluntary_switches() -> int:
    """How often this thread has gone to sleep (/proc's voluntary context switches)."""
    with open("/proc/thread-self/status") as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    raise RuntimeError("no voluntary_ctxt_switches in /proc/thread-self/status")


def case_wait_for_a_late_peer(ctx, late_s, rounds):
    rounds_seen = []
    for _ in range(rounds):
        x = np.ones(3, np.float32)
        ctx.comm.barrier()
        if ctx.rank == 0:
            time.sleep(late_s)
            start = time.monotonic()
            ctx.comm.allreduce(x)
            rounds_seen.append({"start": start})
        else:
            before = voluntary_switches()
            ctx.comm.allreduce(x)
            rounds_seen.append({"end": time.monotonic(), "sleeps": voluntary_switches() - before})
        assert np.array_equal(x, np.full(3, 2, np.float32)), x
    return rounds_seen


def test_a_waiting_rank_wakes_when_its_peer_posts(pools):
    late, waiting = pools.get(2, "shm").run(case_wait_for_a_late_peer, LATE_S, ROUNDS)
    sleeps = [r["sleeps"] for r in waiting]
    # Blind naps: about 700 per round. Rung sleeps: about LATE_S / 10 ms, and a few more.
    assert max(sleeps) < 100, f"rank 1 went to sleep {sleeps} times in rounds of {LATE_S} s"
    # The time from rank 0's call to rank 1's return: a wake-up, where a lost ring would cost
    # up to the 10 ms that a rung sleep lasts by itself.
    lag_ms = [(w["end"] - s["start"]) * 1e3 for s, w in zip(late, waiting)]
    assert statistics.median(lag_ms) < 3, f"rank 1 returned {lag_ms} ms after rank 0 called"
