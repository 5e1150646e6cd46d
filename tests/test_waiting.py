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
# The ring's late rank: long enough that napping (a sleep a millisecond once past 20 ms) stands
# well apart from the sleeps of the early ranks' own exchanges, which move a 4 KiB slot a
# wake-up when other processes hold the cores (up to about 400 a round on 2 busy cores).
RING_LATE_S = 1.0


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


def case_ring_waits_for_a_late_rank(ctx, late_s, rounds, nbytes):
    """Rank size-1 comes late to ring allreduces; the others' ring steps wait both for a message
    and for room to send on."""
    import weft

    comm = weft.Communicator(
        ctx.store, ctx.rank, ctx.size, name=ctx.fresh_name("ring"), timeout=30, algo="ring"
    )
    x = np.ones(nbytes // 4, np.float32)
    sleeps = []
    for _ in range(rounds):
        x[:] = 1
        comm.barrier()
        if ctx.rank == ctx.size - 1:
            time.sleep(late_s)
        before, cpu_before = voluntary_switches(), time.thread_time()
        comm.allreduce(x)
        sleeps.append((voluntary_switches() - before, time.thread_time() - cpu_before))
        assert np.array_equal(x, np.full_like(x, ctx.size)), x[:4]
    return sleeps


def test_a_rank_waiting_on_two_connections_sleeps_until_either_moves(pools):
    # Slots of 4 KiB: 1 MiB fills every FIFO, so the early ranks block receiving and sending.
    sleeps = pools.get(3, "shm-small").run(case_ring_waits_for_a_late_rank, RING_LATE_S, 3, 1 << 20)
    # Napping blind, 50 us at a time for 20 ms and then 1 ms: 1300-1900 sleeps a round here.
    # Asleep on the FIFOs' doorbells (both at once with futex_waitv), woken when a peer rings
    # or after 10 ms: about 100, and up to about 450 when the early ranks' exchange crawls.
    early = [max(n for n, _ in rounds) for rounds in sleeps[:-1]]
    assert max(early) < 800, f"the early ranks went to sleep {sleeps[:-1]} times per round"
    # A wait that spins instead of sleeping goes to sleep rarely too, but spends the wait on
    # the CPU (measured: 4-7 ms of CPU per round).
    cpu_s = [max(c for _, c in rounds) for rounds in sleeps[:-1]]
    assert max(cpu_s) < RING_LATE_S / 3, f"the early ranks spent {cpu_s} s of CPU waiting"
