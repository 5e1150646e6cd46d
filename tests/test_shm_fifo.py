"""Shared-memory FIFOs hold more small messages than slots of data.

A message of up to 32 bytes travels in its slot header, and a FIFO has at least 64 headers but
only WEFT_SHM_SLOTS (8) slots of data, so a broadcast's root posts dozens of small calls before
a receiver that is late takes the first. Messages that need slot data take the slots in order
between them; the second test mixes both kinds, and sends by reference, with a late receiver.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

LATE_S = 0.4
# Fewer than the 64 headers, more than the 8 slots of data.
AHEAD_CALLS = 48


def case_root_runs_ahead(ctx, late_s, calls):
    x = np.zeros(2, np.float32)
    ctx.comm.barrier()
    if ctx.rank != 0:
        time.sleep(late_s)
    start = time.monotonic()
    got = []
    for i in range(calls):
        if ctx.rank == 0:
            x[:] = i
        ctx.comm.broadcast(x, 0)
        got.append(float(x[0]) if x[0] == x[1] else -1.0)
    return time.monotonic() - start, got


def test_a_broadcast_root_posts_small_calls_ahead_of_a_late_receiver(pools):
    results = pools.get(2, "shm").run(case_root_runs_ahead, LATE_S, AHEAD_CALLS)
    root_s = results[0][0]
    # With one message per slot of data the root would stop after 8 calls until the receiver
    # wakes, LATE_S later.
    assert root_s < LATE_S / 2, f"the root took {root_s:.3f} s for {AHEAD_CALLS} calls"
    assert results[1][1] == list(range(AHEAD_CALLS)), results[1][1]


# Bytes per call: in the header (0-32), in slot data (33 and up; several slices with the
# "-small" pools' 4 KiB slots), by reference from 4 KiB in "shm-cma".
MIXED_BYTES = [8, 4, 40, 4, 0, 20_000, 12, 32, 36, 8, 4096, 8, 8, 8, 300_000, 4, 64, 16] * 3


def case_mixed_sizes_to_late_receivers(ctx, late_s, sizes):
    ctx.comm.barrier()
    if ctx.rank != 0:
        time.sleep(late_s)
    wrong = []
    for i, nbytes in enumerate(sizes):
        want = (np.arange(nbytes, dtype=np.int64) * 7 + i).astype(np.uint8)
        x = want.copy() if ctx.rank == 0 else np.zeros(nbytes, np.uint8)
        ctx.comm.broadcast(x, 0)
        if not np.array_equal(x, want):
            wrong.append((i, nbytes))
    return wrong


@pytest.mark.parametrize("transport", ["shm", "shm-small", "shm-cma"])
def test_mixed_message_sizes_keep_their_order_and_bytes(pools, transport):
    # Three ranks: the tree's middle rank forwards while its own receiver is late too.
    wrong = pools.get(3, transport).run(case_mixed_sizes_to_late_receivers, 0.1, MIXED_BYTES)
    assert wrong == [[], [], []], wrong
