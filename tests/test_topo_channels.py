"""Plans of several channels on real ranks: the executor progresses a rank's channels side by
side, each over its own connections (a set per channel tag), waiting across channels only where
a step says so. Hand-written two-channel allreduces and the published MSCCL algorithms (eight
thread blocks per rank) run against numpy; the core refuses a Plan whose tags the communicator
lacks, whose channels would interleave on one connection, or whose dependencies point forward."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import weft
from weft import topo
from weft.topo.run import plan_of

SHARED = Path(__file__).resolve().parents[2] / "shared" / "msccl"
PUBLISHED = sorted(SHARED.glob("*.xml")) if SHARED.is_dir() else []


def ring_allreduce(p, n, k, base, direction, channel):
    """A ring allreduce of chunks [base + c*k, base + (c+1)*k) on `channel`, the ring running
    in `direction` (+1 or -1): reduce-scatter, then allgather, the two joined in one step."""
    for r in range(n):
        nxt, prev = (r + direction) % n, (r - direction) % n

        def chunk(j, buffer, r=r):
            c = (r - j * direction) % n
            return buffer[base + c * k : base + (c + 1) * k]

        p.send(r, to=nxt, src=chunk(0, p.input), channel=channel)
        for j in range(1, n - 1):
            p.recv_reduce_send(r, frm=prev, to=nxt, src=chunk(j, p.input), channel=channel)
        p.recv_reduce_copy_send(
            r,
            frm=prev,
            to=nxt,
            src=chunk(n - 1, p.input),
            dst=chunk(n - 1, p.output),
            channel=channel,
        )
        for j in range(n, 2 * n - 2):
            p.recv_copy_send(r, frm=prev, to=nxt, dst=chunk(j, p.output), channel=channel)
        p.recv(r, frm=prev, dst=chunk(2 * n - 2, p.output), channel=channel)


def bidirectional_ring(n: int, k: int) -> topo.Algorithm:
    """Each half of the buffer goes round its own ring, one clockwise on channel 0, the other
    the other way on channel 1."""
    p = topo.Program("allreduce", ranks=n, count=2 * n * k, name="bidirectional_ring")
    ring_allreduce(p, n, k, 0, +1, channel=0)
    ring_allreduce(p, n, k, n * k, -1, channel=1)
    return p.algorithm()


def split_ring(n: int, k: int, wait: bool = True) -> topo.Algorithm:
    """Reduce-scatter on channel 0, allgather on channel 1: the allgather's first send waits
    for the reduction that produces what it sends (`wait=False` forgets to)."""
    p = topo.Program("allreduce", ranks=n, count=n * k, name="split_ring")
    for r in range(n):
        nxt, prev = (r + 1) % n, (r - 1) % n

        def chunk(j, buffer, r=r):
            c = (r - j) % n
            return buffer[c * k : (c + 1) * k]

        p.send(r, to=nxt, src=chunk(0, p.input), channel=0)
        for j in range(1, n - 1):
            p.recv_reduce_send(r, frm=prev, to=nxt, src=chunk(j, p.input), channel=0)
        reduced = p.recv_reduce(
            r, frm=prev, src=chunk(n - 1, p.input), dst=chunk(n - 1, p.output), channel=0
        )
        p.send(r, to=nxt, src=chunk(n - 1, p.output), channel=1, after=reduced if wait else ())
        for j in range(n, 2 * n - 2):
            p.recv_copy_send(r, frm=prev, to=nxt, dst=chunk(j, p.output), channel=1)
        p.recv(r, frm=prev, dst=chunk(2 * n - 2, p.output), channel=1)
    return p.algorithm()


def test_the_checker_passes_them_and_catches_a_missing_dependency():
    for n in (2, 3, 5):
        for algo in (bidirectional_ring(n, 3), split_ring(n, 2)):
            assert topo.check(algo).ok, topo.check(algo)
    report = topo.check(split_ring(3, 2, wait=False))
    assert not report.ok
    assert "rank" in str(report.errors[0]) and "channel 1" in str(report.errors[0])


def test_channels_sharing_a_connection_are_refused_by_the_checker():
    p = topo.Program("allgather", ranks=2, count=2, name="shared")
    for r in (0, 1):
        p.send(r, to=1 - r, src=p.input[0:1], channel=0)
        p.send(r, to=1 - r, src=p.input[1:2], channel=1)
        p.recv(r, frm=1 - r, dst=p.output[0:1], channel=0)
        p.recv(r, frm=1 - r, dst=p.output[1:2], channel=1)
    algo = p.algorithm()
    for program in algo.programs:
        program.channels[1].tag = 0
    report = topo.check(algo)
    assert any("would interleave" in str(e) for e in report.errors), report


def inputs_of(n: int, size: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(-50, 50, size).astype(np.float32) for _ in range(n)]


def case_two_channel_allreduces(ctx, k, factor):
    comm, n, r = ctx.comm, ctx.size, ctx.rank
    wrong = []
    for algo in (bidirectional_ring(n, k), split_ring(n, k)):
        inputs = inputs_of(n, algo.count * factor, seed=n * 100 + k)
        out = np.full(algo.count * factor, np.nan, np.float32)
        topo.run(algo, comm, inputs[r], out)
        if not np.array_equal(out, sum(inputs)):
            wrong.append(f"rank {r}: {algo.name} k={k} x{factor}: {out[:8]} ...")
    return wrong


@pytest.mark.parametrize("size,transport", [(3, "shm"), (4, "tcp-small")])
def test_two_channel_allreduces_run_side_by_side(pools, size, transport):
    pool = pools.get(size, transport)
    # Steps of at most half the 4 KiB x 4 slots of tcp-small: larger ones deadlock a ring that
    # sends before it receives, as the checker says.
    for k, factor in ((1, 1), (5, 1), (3, 509)):
        wrong = [w for rank in pool.run(case_two_channel_allreduces, k, factor) for w in rank]
        assert not wrong, "\n".join(wrong[:5])


def gather_and_reduce(n: int, k: int) -> topo.Algorithm:
    """An allreduce of 3 ranks with a `reduce` step: each rank sends its input both ways round
    (channels 0 and 1), and a third channel, which sends nothing, copies the input to the output
    and adds each received block once its channel has it."""
    p = topo.Program("allreduce", ranks=n, count=k, name="gather_and_reduce")
    for r in range(n):
        p.send(r, to=(r + 1) % n, src=p.input[0:k], channel=0)
        left = p.recv(r, frm=(r - 1) % n, dst=p.scratch[0:k], channel=0)
        p.send(r, to=(r - 1) % n, src=p.input[0:k], channel=1)
        right = p.recv(r, frm=(r + 1) % n, dst=p.scratch[k : 2 * k], channel=1)
        p.copy(r, src=p.input[0:k], dst=p.output[0:k], channel=2)
        p.reduce(r, src=p.scratch[0:k], dst=p.output[0:k], channel=2, after=left)
        p.reduce(r, src=p.scratch[k : 2 * k], dst=p.output[0:k], channel=2, after=right)
    return p.algorithm()


def case_reduce_steps(ctx):
    comm, n, r = ctx.comm, ctx.size, ctx.rank
    algo = gather_and_reduce(n, 5)
    inputs = inputs_of(n, 5 * 61, seed=3)
    out = np.zeros(5 * 61, np.float32)
    topo.run(algo, comm, inputs[r], out)
    return bool(np.array_equal(out, sum(inputs)))


def test_reduce_steps_run_on_a_channel_without_connections(pools):
    assert topo.check(gather_and_reduce(3, 5)).ok
    assert pools.get(3, "shm").run(case_reduce_steps) == [True] * 3


def case_tree_on_channels(ctx, count, channel_counts):
    """The double tree on its two channels (each tree's reduction with the other's broadcast,
    on one connection set), planned for one connection set per peer and for two, through the
    executor, over many rounds."""
    comm, n, r = ctx.comm, ctx.size, ctx.rank
    results = []
    for channels in channel_counts:
        algo = topo.builtin(
            "allreduce", "tree", n, count=count, channels=channels, slot_bytes=4096, slots=4
        )
        results.append(len(algo.programs[r].channels))
        inputs = inputs_of(n, count, seed=count)
        out = np.zeros(count, np.float32)
        topo.run(algo, comm, inputs[r], out)
        results.append(bool(np.array_equal(out, sum(inputs))))
    return results


def test_the_double_tree_runs_on_its_two_channels(pools):
    for count in (4099, 20011):
        for transport in ("tcp-small", "shm-8-channels"):
            assert (
                pools.get(4, transport).run(case_tree_on_channels, count, (1, 2))
                == [[2, True, 2, True]] * 4
            )


def case_refusals(ctx):
    comm, n, r = ctx.comm, ctx.size, ctx.rank
    # Both channels of the split ring talk to the same two neighbours.
    plan = plan_of(split_ring(n, 4), r)
    x, out = np.ones(4 * n, np.float32), np.zeros(4 * n, np.float32)
    errors = []
    for edit in (
        lambda p: p.update(channel_tags=[0, 5]),
        lambda p: p.update(channel_tags=[1, 1]),
        lambda p: p["steps"][0].update(after=[len(p["steps"])]),
        lambda p: p["steps"][0].update(channel=2),
    ):
        bad = {**plan, "steps": [dict(s) for s in plan["steps"]]}
        edit(bad)
        with pytest.raises(weft.InvalidArgument) as e:
            comm.run_plan(bad, x, out)
        errors.append(str(e.value))
    comm.allreduce(x)
    errors.append(bool(np.all(x == n)))
    return errors


def test_what_the_connections_cannot_carry_is_refused(pools):
    results = pools.get(3, "shm").run(case_refusals)
    tags, shared, forward, channel, still_works = results[0]
    assert "tag 5" in tags and "WEFT_CHANNELS=6" in tags
    assert "would interleave" in shared
    assert "not an earlier one" in forward
    assert "channel 2 is not one of the plan's 2" in channel
    assert still_works


def case_published(ctx, path, factor):
    comm, r = ctx.comm, ctx.rank
    algo = topo.load_msccl(path)
    sizes = algo.buffer_counts(r)
    inputs = inputs_of(algo.ranks, sizes["input"] * factor, seed=factor)
    expected = sum(inputs) if algo.collective == "allreduce" else np.concatenate(inputs)
    if algo.in_place:
        out = inputs[r].copy()
        topo.run(algo, comm, out, out)
    else:
        out = np.full(sizes["output"] * factor, np.nan, np.float32)
        topo.run(algo, comm, inputs[r], out)
    return bool(np.array_equal(out, expected))


@pytest.mark.skipif(not PUBLISHED, reason="../shared/msccl (the published MSCCL files) is absent")
@pytest.mark.parametrize("path", PUBLISHED, ids=lambda p: p.stem)
def test_published_msccl_algorithms_run(pools, path):
    algo = topo.load_msccl(path)
    pool = pools.get(algo.ranks, "shm-8-channels")
    for factor in (1, 97, 4096):
        assert pool.run(case_published, str(path), factor) == [True] * algo.ranks, factor
