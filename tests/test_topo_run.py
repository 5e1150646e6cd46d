"""topo.run: Algorithms through the executor on real ranks, against numpy. Built-in Plans exported
as data and run back, scaled to larger buffers, in place, and a hand-written one; Algorithms the
checker fails, or that the executor cannot run, are refused on every rank before anything is
sent; a Plan whose spans leave the buffers is refused by the core itself."""

from __future__ import annotations

import numpy as np
import pytest
import weft
from weft import topo
from weft.topo import Span, Step
from weft.topo.run import connection_geometry, plan_of

REFERENCE = {
    "allreduce": lambda inputs, r, n, c: sum(inputs),
    "reduce_scatter": lambda inputs, r, n, c: sum(inputs)[r * c : (r + 1) * c],
    "allgather": lambda inputs, r, n, c: np.concatenate(inputs),
    "alltoall": lambda inputs, r, n, c: np.concatenate([x[r * c : (r + 1) * c] for x in inputs]),
}


def inputs_of(n: int, size: int) -> list[np.ndarray]:
    """Every rank's input, the same on every rank: small integers, exact in float32."""
    rng = np.random.default_rng(size * 1000 + n)
    return [rng.integers(-50, 50, size).astype(np.float32) for _ in range(n)]


def case_builtins_run(ctx, count, factor):
    """Every family of each collective, exported, run back, scaled by `factor`."""
    comm, n, r = ctx.comm, ctx.size, ctx.rank
    slots, slot_bytes = connection_geometry(comm)
    wrong = []
    for collective, reference in REFERENCE.items():
        for family in topo.FAMILIES[collective]:
            if collective != "alltoall" and family not in topo.algorithms_for(
                collective, comm.topology
            ):
                continue
            algo = topo.builtin(
                collective,
                family,
                n,
                count=count,
                hosts=comm.topology.hosts,
                slot_bytes=slot_bytes,
                slots=slots,
            )
            sizes = algo.buffer_counts(r)
            inputs = inputs_of(n, sizes["input"] * factor)
            out = np.full(sizes["output"] * factor, np.nan, dtype=np.float32)
            topo.run(algo, comm, inputs[r], out)
            expected = reference(inputs, r, n, count * factor)
            if not np.array_equal(out, expected):
                wrong.append(f"rank {r}: {collective} {family} x{factor}: {out} != {expected}")
    return wrong


def case_in_place_and_avg(ctx):
    comm, n, r = ctx.comm, ctx.size, ctx.rank
    slots, slot_bytes = connection_geometry(comm)
    algo = topo.builtin(
        "allreduce",
        "ring",
        n,
        count=11,
        in_place=True,
        avg=True,
        slot_bytes=slot_bytes,
        slots=slots,
    )
    inputs = inputs_of(n, 11 * 4)
    buf = inputs[r].copy()
    topo.run(algo, comm, buf, buf, op="avg")
    gathered = topo.builtin(
        "allgather", "ring", n, count=3, in_place=True, slot_bytes=slot_bytes, slots=slots
    )
    out = np.zeros(3 * n, dtype=np.float32)
    out[r * 3 : (r + 1) * 3] = r + 1
    topo.run(gathered, comm, out[r * 3 : (r + 1) * 3], out)
    with pytest.raises(topo.AlgorithmError, match="must be the view at element"):
        topo.run(gathered, comm, np.zeros(3, np.float32), out)
    return [
        np.allclose(buf, sum(inputs) / n),
        np.array_equal(out, np.repeat(np.arange(1, n + 1, dtype=np.float32), 3)),
    ]


def pairwise_steps(rank: int) -> list[Step]:
    """A hand-written allreduce of 2 ranks: swap inputs, then add them."""
    peer = 1 - rank
    return [
        Step(send=peer, local=Span("input", 0, 4), count=4),
        Step(recv=peer, dst=Span("scratch", 0, 4), count=4),
        Step(local=Span("input", 0, 4), dst=Span("scratch", 4, 4), count=4),
        Step(kind="local_reduce", local=Span("scratch", 0, 8), dst=Span("output", 0, 4), count=4),
    ]


def case_hand_written_pairwise(ctx):
    programs = [topo.RankProgram([topo.Channel(pairwise_steps(q))], scratch=8) for q in (0, 1)]
    algo = topo.Algorithm("pairwise", "allreduce", 2, 4, programs)
    x = np.arange(4 * 5, dtype=np.float64) * (ctx.rank + 1)
    out = np.empty_like(x)
    topo.run(algo, ctx.comm, x, out)  # each element of the Algorithm stands for 5
    return np.array_equal(out, np.arange(20, dtype=np.float64) * 3)


def case_refusals(ctx):
    """Refusals come on every rank alike, before anything is sent; the communicator goes on."""
    comm, n, r = ctx.comm, ctx.size, ctx.rank
    swapped = topo.builtin("allreduce", "ring", n, count=2 * n)
    steps = swapped.programs[n - 1].channels[0].steps
    steps[-1].dst, steps[-2].dst = steps[-2].dst, steps[-1].dst
    x, out = np.ones(2 * n, np.float32), np.zeros(2 * n, np.float32)
    messages = []
    for algo, buffers in (
        (swapped, (x, out)),
        (topo.builtin("allreduce", "ring", n, count=2 * n), (x, out[:-1])),
        (topo.builtin("allreduce", "ring", n + 1, count=2), (x, out)),
    ):
        with pytest.raises(topo.AlgorithmError) as e:
            topo.run(algo, comm, *buffers)
        messages.append(str(e.value).splitlines()[0])
    ring = plan_of(topo.builtin("allreduce", "ring", n, count=2 * n), r)
    for edit, error in (
        (lambda p: p["steps"][0].update(local=("input", 2 * n, 1)), r"input\[.*\] lies outside"),
        (lambda p: p.update(scratch=2**62 + 1), "beyond memory"),
        (
            lambda p: p["steps"][-1].update(dst=("input", 0, p["steps"][-1]["count"])),
            "writes into the input",
        ),
        (lambda p: p["steps"][0].update(deps=[[0, 0]]), "knows no 'deps'"),
        (lambda p: p["steps"][0].update(copy_sends=1), "'copy_sends' has the wrong type"),
    ):
        bad = {**ring, "steps": [dict(s) for s in ring["steps"]]}
        edit(bad)
        with pytest.raises(weft.InvalidArgument, match=error):
            comm.run_plan(bad, x, out)
    comm.allreduce(x)
    messages.append(bool(np.all(x == n)))
    return messages


@pytest.mark.parametrize("size,transport", [(3, "shm"), (4, "tcp-small")])
def test_builtin_plans_run_back_through_the_executor(pools, size, transport):
    pool = pools.get(size, transport)
    for count, factor in ((5, 1), (4, 3), (1, 7)):
        wrong = [w for ranks in pool.run(case_builtins_run, count, factor) for w in ranks]
        assert not wrong, "\n".join(wrong[:5])


def test_in_place_and_avg(pools):
    for result in pools.get(3, "shm").run(case_in_place_and_avg):
        assert result == [True, True]


def test_a_hand_written_algorithm_runs(pools):
    assert pools.get(2, "shm").run(case_hand_written_pairwise) == [True, True]


def test_what_cannot_run_is_refused_on_every_rank(pools):
    results = pools.get(3, "shm").run(case_refusals)
    assert all(r == results[0] for r in results)
    failing, mis_sized, other_world, still_works = results[0]
    assert "fails the checker" in failing
    assert "not one whole multiple" in mis_sized
    assert "is for 4 ranks; the communicator has 3" in other_world
    assert still_works
