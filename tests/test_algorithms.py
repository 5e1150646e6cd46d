"""Every algorithm family, forced, against numpy: allreduce (ring, tree, rd, rhd, oneshot, hier),
broadcast and reduce (chain, tree), on world sizes 1 to 9.

The pools use tiny connection slots (see weft_pool.SMALL_SLOTS), so the larger counts run
through many slices and chunked rounds, which is where pipelined algorithms can go wrong;
shm-cma sends messages from 4 KiB by reference, which the peer reads while the sender waits. Each
case makes a communicator with ``algo=`` on the pool's store and reuses the collective checks
of test_collectives.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import weft
from test_collectives import (
    case_allgather,
    case_allreduce,
    case_broadcast,
    case_reduce,
    case_reduce_scatter,
)
from weft import topo
from weft_pool import COMM_TIMEOUT_S
from weft_ref import DTYPES, OPS, assert_no_mismatch, make_buffer, to_numpy

WORLDS = (
    [(n, "shm-small") for n in range(1, 10)]
    + [(n, "tcp-small") for n in range(2, 10)]
    + [(n, "hosts-of-2") for n in (4, 6)]
    + [(n, "shm-cma") for n in (2, 3)]
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


def forced_communicator(ctx, algo: str) -> weft.Communicator:
    """A new communicator of the pool's world held to family ``algo``."""
    return weft.Communicator(
        ctx.store, ctx.rank, ctx.size, name=ctx.fresh_name(algo), timeout=COMM_TIMEOUT_S, algo=algo
    )


def case_forced(ctx, collective, algo, dtypes, ops, counts):
    """Runs the collective's checks on a communicator that must use ``algo``."""
    comm = forced_communicator(ctx, algo)
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
] + [
    # Four hosts of two: the shards cross the hosts by recursive halving and doubling.
    pytest.param(8, "hosts-of-2", "allreduce", "hier", id="allreduce-hier-ws8-hosts-of-2")
]


@pytest.mark.parametrize(("size", "transport", "collective", "algo"), PARAMS)
def test_forced_algorithm(pools, size, transport, collective, algo):
    pool = pools.get(size, transport)
    assert_no_mismatch(pool.run(case_forced, collective, algo, DTYPES, OPS, COUNTS))
    assert_no_mismatch(pool.run(case_forced, collective, algo, LARGE_DTYPES, OPS, (LARGE,)))


def case_oneshot_in_place_at_full_steps(ctx, counts):
    """Two ranks' in-place oneshot sends its whole input before it reduces the peer's message
    into it. Were that send by reference (process_vm_readv, or a socket's buffer smaller than
    a step), waiting for it to leave before the reduction would wait for a peer that waits too."""
    comm = forced_communicator(ctx, "oneshot")
    lines = []
    for count in counts:
        for call in range(3):
            mine = np.arange(count, dtype=np.float32) % 1000 * (ctx.rank + 1) + call
            buf = make_buffer("np.float32", mine)
            comm.allreduce(buf)
            want = np.arange(count, dtype=np.float32) % 1000 * 3 + 2 * call
            if not np.array_equal(buf, want):
                lines.append(f"rank {ctx.rank}: {count} floats, call {call}: wrong sum")
    return lines


@pytest.mark.parametrize("transport", ["tcp", "shm", "shm-cma"])
def test_oneshot_in_place_on_two_ranks_at_full_steps(pools, transport):
    # 64 KiB, 1 MiB and 2 MiB less one float: up to a whole tcp step (1 MiB x 4 slots / 2);
    # shm's step (1 MiB) takes the larger ones in the staged form.
    counts = (16 << 10, 256 << 10, (512 << 10) - 1)
    assert_no_mismatch(pools.get(2, transport).run(case_oneshot_in_place_at_full_steps, counts))


FLOAT_DTYPES = ("np.float32", "np.float64", "np.float16", "torch.bfloat16")
NAN_WORLDS = [(2, "shm-small"), (3, "shm-small"), (8, "shm-small"), (4, "hosts-of-2")]


def nan_and_signed_zeros(rank: int, count: int) -> np.ndarray:
    """Small integers (exact in every float type), a NaN where i % 7 == rank % 7, and signed
    zeros where i % 5 == 0, their sign varying with the rank."""
    x = np.random.default_rng(rank).integers(-50, 50, count).astype(np.float64)
    i = np.arange(count)
    x[i % 5 == 0] = np.where((i[i % 5 == 0] + rank) % 2 == 0, 0.0, -0.0)
    x[i % 7 == rank % 7] = np.nan
    return x


def min_max_reference(op: str, size: int, count: int) -> np.ndarray:
    """NaN where any rank has NaN; of +0 and -0, min takes -0 and max +0."""
    xs = np.stack([nan_and_signed_zeros(r, count) for r in range(size)])
    out = np.min(xs, axis=0) if op == "min" else np.max(xs, axis=0)  # propagates NaN
    zero = out == 0
    negative = np.signbit(xs).any(axis=0) if op == "min" else np.signbit(xs).all(axis=0)
    out[zero] = np.where(negative[zero], -0.0, 0.0)
    return out


def case_min_max_agree(ctx, algo):
    """MIN and MAX with NaNs and signed zeros: every rank gets the same bits, whichever order
    its algorithm combines the operands in."""
    comm = forced_communicator(ctx, algo)
    lines = []
    count = 1031
    for dtype in FLOAT_DTYPES:
        for op in ("min", "max"):
            ctx.note(f"{algo} {dtype} {op}")
            buf = make_buffer(dtype, nan_and_signed_zeros(ctx.rank, count))
            comm.allreduce(buf, op=op)
            got = to_numpy(buf).astype(np.float64)
            want = min_max_reference(op, ctx.size, count)
            same = (np.isnan(got) == np.isnan(want)) & (
                np.isnan(want) | ((got == want) & (np.signbit(got) == np.signbit(want)))
            )
            if not same.all():
                at = int(np.argmin(same))
                lines.append(
                    f"rank {ctx.rank}: {algo} {dtype} {op}: element {at} is {got[at]!r}, "
                    f"expected {want[at]!r} ({int((~same).sum())} differ)"
                )
    return lines


@pytest.mark.parametrize(
    ("size", "transport", "algo"),
    [
        pytest.param(n, t, a, id=f"{a}-ws{n}-{t}")
        for n, t in NAN_WORLDS
        for a in FAMILIES["allreduce"]
        if applies("allreduce", a, n, t)
    ],
)
def test_min_max_agree_on_every_rank(pools, size, transport, algo):
    assert_no_mismatch(pools.get(size, transport).run(case_min_max_agree, algo))


def choosing_and_forced_ring(ctx):
    """Two new communicators of the pool's world: one that chooses families, one held to ring."""
    comm = weft.Communicator(
        ctx.store, ctx.rank, ctx.size, name=ctx.fresh_name("auto"), timeout=COMM_TIMEOUT_S
    )
    return comm, forced_communicator(ctx, "ring")


def case_measured_plans(ctx):
    """A communicator that chooses for itself: what it measured, and what it then predicts."""
    comm, forced = choosing_and_forced_ring(ctx)
    rivals = {
        c: topo.algorithms_for(c, comm.topology)
        for c in ("allreduce", "reduce_scatter", "allgather")
        if len(topo.algorithms_for(c, comm.topology)) > 1
    }
    return {
        "measured": comm.cost_model.measured,
        "rivals": rivals,
        "choice_64": comm.algorithm("allreduce", 64),
        "forced_measured": forced.cost_model.measured,
    }


@pytest.mark.parametrize(
    ("size", "transport"), [(3, "shm-small"), (4, "hosts-of-2")], ids=["ws3-shm", "ws4-hosts"]
)
def test_a_choosing_communicator_times_every_rival_family(pools, size, transport):
    # Every family of allreduce, reduce-scatter and allgather that has a rival is timed at every
    # size of topo.MEASURED_BYTES (broadcast and reduce are not: back to back, their calls
    # overlap), every rank holds the same figures, and a 64-byte allreduce goes to the family
    # that measured cheapest there. A communicator with a forced family measures nothing.
    reports = pools.get(size, transport).run(case_measured_plans)
    first = reports[0]
    assert all(r["measured"] == first["measured"] for r in reports)
    timed = {(c, a, b) for c, a, b, seconds in first["measured"] if seconds > 0}
    sizes = topo.MEASURED_BYTES
    expected = {(c, a, b) for c, fams in first["rivals"].items() for a in fams for b in sizes}
    assert "allreduce" in first["rivals"] and timed == expected
    if transport == "hosts-of-2":
        assert "hier" in first["rivals"]["allreduce"]
    at_64 = {a: s for c, a, b, s in first["measured"] if c == "allreduce" and b == 64}
    cheapest = min(at_64, key=at_64.get)
    assert first["choice_64"] == (cheapest, at_64[cheapest])
    assert all(r["forced_measured"] == [] for r in reports)


def case_trials(ctx, collective, count):
    """A choosing communicator's first calls of `collective` at a new size: each result right
    while the tuner tries families on them, then the family the trials chose."""
    comm, forced = choosing_and_forced_ring(ctx)
    nbytes, n = count * 4, ctx.size
    in_place = collective == "allreduce"  # the calls below: allreduce in place, the others not
    report = {
        "trying_before": comm.trying(collective, nbytes, in_place=in_place),
        "forced_trying": forced.trying(collective, nbytes, in_place=in_place),
        "broadcast_trying": comm.trying("broadcast", nbytes),
        "wrong": [],
    }
    calls = 0
    base = np.arange(count * n, dtype=np.float32)  # integers: every order of sums is exact
    while comm.trying(collective, nbytes, in_place=in_place) and calls < 1000:
        mine = base * (ctx.rank + 1) + calls
        everyone = base * (n * (n + 1) // 2) + n * calls
        if collective == "allreduce":
            got, want = comm.allreduce(mine[:count].copy()), everyone[:count]
        elif collective == "reduce_scatter":
            got = comm.reduce_scatter(mine, out=np.empty(count, np.float32))
            want = everyone[ctx.rank * count : (ctx.rank + 1) * count]
        else:
            block = mine[ctx.rank * count : (ctx.rank + 1) * count]
            got = comm.allgather(block.copy(), out=np.empty(count * n, np.float32))
            want = np.concatenate(
                [base[r * count : (r + 1) * count] * (r + 1) + calls for r in range(n)]
            )
        if not np.array_equal(got, want):
            report["wrong"].append(calls)
        calls += 1
    report.update(
        calls=calls,
        chosen=comm.algorithm(collective, nbytes, in_place=in_place),
        # The range is [2^k, 2^(k+1)) bytes: one element more is decided, a size twice as
        # large is not begun, nor are the calls of the other form (in place or not), which
        # try on their own, but for reduce-scatter, whose Plans are the same either way.
        chosen_next=comm.algorithm(collective, nbytes + 4, in_place=in_place),
        trying_next=comm.trying(collective, nbytes + 4, in_place=in_place),
        trying_double=comm.trying(collective, 2 * nbytes, in_place=in_place),
        trying_other_form=comm.trying(collective, nbytes, in_place=not in_place),
        families=topo.algorithms_for(collective, comm.topology),
    )
    return report


@pytest.mark.parametrize(
    ("size", "transport", "collective", "count"),
    [
        (4, "tcp-small", "allreduce", 1031),
        (3, "shm-small", "allreduce", 17),
        (4, "tcp-small", "reduce_scatter", 257),
        (4, "tcp-small", "allgather", 257),
        (4, "hosts-of-2", "allreduce", 5),
    ],
    ids=[
        "ws4-tcp-allreduce",
        "ws3-shm-allreduce",
        "ws4-reduce_scatter",
        "ws4-allgather",
        "ws4-hosts-allreduce",
    ],
)
def test_trials_choose_one_family_for_every_rank(pools, size, transport, collective, count):
    # The first calls at each power-of-two range of sizes are trials of the families the model
    # finds close (family_trials.h): every result is right, every rank ends after the same
    # calls (at most 4 families x 3 rounds x 64 calls) with the same family, which the whole
    # range then runs. Forced communicators, and collectives the trials leave alone, try
    # nothing.
    reports = pools.get(size, transport).run(case_trials, collective, count)
    first = reports[0]
    assert all(r["wrong"] == [] for r in reports), [r["wrong"] for r in reports]
    assert first["trying_before"] and not first["forced_trying"] and not first["broadcast_trying"]
    assert all(r["calls"] == first["calls"] for r in reports)
    # One call where the model finds no rival close; otherwise at least 2 families x 3 rounds
    # x 4 calls.
    assert first["calls"] == 1 or 24 <= first["calls"] <= 768, first
    assert all(r["chosen"] == first["chosen"] for r in reports)
    assert first["chosen"][0] in first["families"] and first["chosen"][1] > 0
    assert first["chosen_next"] == first["chosen"] and not first["trying_next"]
    assert first["trying_double"]
    assert first["trying_other_form"] == (collective != "reduce_scatter")
