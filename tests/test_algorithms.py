"""Every algorithm family, forced, against numpy: allreduce (ring, tree, rd, rhd, oneshot, hier),
broadcast and reduce (chain, tree), on world sizes 1 to 9.

The pools use tiny connection slots (see weft_pool.SMALL_SLOTS), so the larger counts run
through many slices and chunked rounds, which is where pipelined algorithms can go wrong. Each
case makes a communicator with ``algo=`` on the pool's store and reuses the collective checks
of test_collectives.py.
"""

from __future__ import annotations

import pytest
import weft
from test_collectives import (
    case_allgather,
    case_allreduce,
    case_broadcast,
    case_reduce,
    case_reduce_scatter,
)
from weft_pool import COMM_TIMEOUT_S
from weft_ref import DTYPES, OPS, assert_no_mismatch

WORLDS = (
    [(n, "shm-small") for n in range(1, 10)]
    + [(n, "tcp-small") for n in (3, 8)]
    + [(n, "hosts-of-2") for n in (4, 6)]
)
COUNTS = (0, 1, 5, 4099)  # 4099 is prime
LARGE = 65537  # prime; 256 KiB of float32 crosses 64 slots
LARGE_DTYPES = ("np.float32", "torch.bfloat16", "np.int64")
FAMILIES = {
    "allreduce": ("ring", "tree", "rd", "rhd", "oneshot", "hier"),
    "broadcast": ("chain", "tree"),
    "reduce": ("chain", "tree"),
    "reduce_scatter": ("ring", "rhd"),
    "allgather": ("ring", "rhd"),
}
CASES = {
    "allreduce": case_allreduce,
    "broadcast": case_broadcast,
    "reduce": case_reduce,
    "reduce_scatter": case_reduce_scatter,
    "allgather": case_allgather,
}


def case_forced(ctx, collective, algo, dtypes, ops, counts):
    """Runs the collective's checks on a communicator that must use ``algo``."""
    comm = weft.Communicator(
        ctx.store, ctx.rank, ctx.size, name=ctx.fresh_name(algo), timeout=COMM_TIMEOUT_S, algo=algo
    )
    chosen, predicted = comm.algorithm(collective, 4096)
    if ctx.size > 1 and chosen != algo:
        return [f"rank {ctx.rank}: {collective} forced to {algo} chose {chosen}"]
    main, ctx.comm = ctx.comm, comm
    try:
        return CASES[collective](ctx, dtypes, ops, counts)
    finally:
        ctx.comm = main


def applies(collective: str, algo: str, size: int, transport: str) -> bool:
    """hier needs several hosts with the same number of ranks each; rhd's reduce-scatter and
    allgather need a power-of-two world; ring is what test_collectives covers for those two."""
    if algo == "hier":
        return transport == "tcp-small" or (transport == "hosts-of-2" and size % 2 == 0)
    if collective in ("reduce_scatter", "allgather"):
        return algo == "rhd" and size & (size - 1) == 0
    return True


PARAMS = [
    pytest.param(n, t, c, a, id=f"{c}-{a}-ws{n}-{t}")
    for n, t in WORLDS
    for c, algos in FAMILIES.items()
    for a in algos
    if applies(c, a, n, t) and n > 1 or (n == 1 and a in ("ring", "chain"))
]


@pytest.mark.parametrize(("size", "transport", "collective", "algo"), PARAMS)
def test_forced_algorithm(pools, size, transport, collective, algo):
    pool = pools.get(size, transport)
    assert_no_mismatch(pool.run(case_forced, collective, algo, DTYPES, OPS, COUNTS))
    assert_no_mismatch(pool.run(case_forced, collective, algo, LARGE_DTYPES, OPS, (LARGE,)))
