"""Correctness of every weft collective against numpy, on real processes.

Each test sends one *case* function to a pool of rank processes (see weft_pool.py); the case
loops over dtypes x ops x counts x modes on every rank, checks its own results against a numpy
reference built from the deterministic inputs of all ranks (weft_ref.py), and returns a list of
mismatch lines, so a failure says exactly which op/dtype/count/mode/rank was wrong.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from datetime import timedelta

import numpy as np
import pytest
from weft_ref import (
    COUNTS,
    DTYPES,
    OPS,
    Checker,
    assert_no_mismatch,
    describe_buffer,
    input_kind,
    is_invalid_argument,
    make_buffer,
    reduce_ref,
    reduced,
    same_kind,
    sentinel_buffer,
    stacked,
    values,
)

# (world size, transport) pools: every size over shared memory and over TCP chosen
# automatically (one host identity per rank), plus TCP forced on one host.
MATRIX = [(n, t) for n in (1, 2, 3, 4, 5) for t in ("shm", "tcp")] + [(3, "tcp-forced")]
SMALL_WORLDS = [(n, t) for n in (2, 3, 5) for t in ("shm", "tcp")]
MOVE_COUNTS = (0, 1, 7, 1000, 2**18 + 1)


def world_params(worlds):
    return pytest.mark.parametrize(
        ("size", "transport"), worlds, ids=[f"ws{n}-{t}" for n, t in worlds]
    )


def roots_of(size: int, count: int) -> list[int]:
    """Roots to try: first, middle and last rank; only the last one for large counts."""
    return [size - 1] if count > 1000 else sorted({0, size // 2, size - 1})


# ---- the five reducing / gathering collectives: cases run on every rank -----------------------


def case_allreduce(ctx, dtypes, ops, counts):
    check = Checker(ctx.rank, ctx.note)
    for dtype in dtypes:
        for count in counts:
            for op in ops:
                kind = input_kind(op, dtype)
                mine = values(dtype, kind, ctx.rank, 0, count)
                expected = reduced(dtype, kind, ctx.size, op, 0, count)
                for mode in ("in-place", "out-of-place"):
                    with check.case(f"allreduce {dtype} op={op} count={count} {mode}"):
                        buf = make_buffer(dtype, mine)
                        if mode == "in-place":
                            check.check_returned(ctx.comm.allreduce(buf, op=op), buf, "buf")
                            check.check(buf, expected, dtype, op)
                        else:
                            out = sentinel_buffer(dtype, count)
                            ret = ctx.comm.allreduce(buf, op=op, out=out)
                            check.check_returned(ret, out, "out")
                            check.check(out, expected, dtype, op)
                            check.check(buf, mine, dtype, None, "input changed")
    return check.lines


def case_reduce_scatter(ctx, dtypes, ops, counts):
    """``count`` is the number of elements each rank receives."""
    check = Checker(ctx.rank, ctx.note)
    n, rank = ctx.size, ctx.rank
    for dtype in dtypes:
        for count in counts:
            for op in ops:
                kind = input_kind(op, dtype)
                mine = values(dtype, kind, rank, 0, n * count)
                expected = reduced(dtype, kind, n, op, rank * count, (rank + 1) * count)
                for mode in ("out given", "out=None"):
                    with check.case(f"reduce_scatter {dtype} op={op} count={count} {mode}"):
                        buf = make_buffer(dtype, mine)
                        if mode == "out given":
                            out = sentinel_buffer(dtype, count)
                            ret = ctx.comm.reduce_scatter(buf, op=op, out=out)
                            check.check_returned(ret, out, "out")
                        else:
                            ret = ctx.comm.reduce_scatter(buf, op=op)
                        if same_kind(ret, dtype, count):
                            check.check(ret, expected, dtype, op)
                        else:
                            check.fail(f"returned {describe_buffer(ret)}, expected {count} elems")
                        check.check(buf, mine, dtype, None, "input changed")
    return check.lines


def case_allgather(ctx, dtypes, ops, counts):
    """``count`` is the number of elements each rank contributes; ``ops`` is unused."""
    check = Checker(ctx.rank, ctx.note)
    n = ctx.size
    for dtype in dtypes:
        for count in counts:
            inputs = stacked(dtype, "bits", n, 0, count)
            expected = inputs.reshape(-1)
            for mode in ("out given", "out=None"):
                with check.case(f"allgather {dtype} count={count} {mode}"):
                    buf = make_buffer(dtype, inputs[ctx.rank])
                    if mode == "out given":
                        out = sentinel_buffer(dtype, n * count)
                        ret = ctx.comm.allgather(buf, out=out)
                        check.check_returned(ret, out, "out")
                    else:
                        ret = ctx.comm.allgather(buf)
                    if same_kind(ret, dtype, n * count):
                        check.check(ret, expected, dtype)
                    else:
                        check.fail(f"returned {describe_buffer(ret)}, expected {n * count} elems")
                    check.check(buf, inputs[ctx.rank], dtype, None, "input changed")
    return check.lines


def case_broadcast(ctx, dtypes, ops, counts):
    """``ops`` is unused; the roots are roots_of(size, count)."""
    check = Checker(ctx.rank, ctx.note)
    for dtype in dtypes:
        for count in counts:
            for root in roots_of(ctx.size, count):
                expected = values(dtype, "bits", root, 0, count)
                garbage = values(dtype, "bits", ctx.rank, 0, count, salt="not the root's")
                with check.case(f"broadcast {dtype} count={count} root={root}"):
                    buf = make_buffer(dtype, expected if ctx.rank == root else garbage)
                    check.check_returned(ctx.comm.broadcast(buf, root=root), buf, "buf")
                    check.check(buf, expected, dtype)
    return check.lines


def case_reduce(ctx, dtypes, ops, counts):
    """Root's result must be right; other ranks' buffers must be left unchanged."""
    check = Checker(ctx.rank, ctx.note)
    for dtype in dtypes:
        for count in counts:
            for op in ops:
                kind = input_kind(op, dtype)
                mine = values(dtype, kind, ctx.rank, 0, count)
                expected = reduced(dtype, kind, ctx.size, op, 0, count)
                for root in roots_of(ctx.size, count):
                    for mode in ("in-place", "out-of-place"):
                        desc = f"reduce {dtype} op={op} count={count} root={root} {mode}"
                        with check.case(desc):
                            buf = make_buffer(dtype, mine)
                            if mode == "in-place":
                                ret = ctx.comm.reduce(buf, root=root, op=op)
                                check.check_returned(ret, buf, "buf")
                                result = buf
                            else:
                                out = sentinel_buffer(dtype, count)
                                ret = ctx.comm.reduce(buf, root=root, op=op, out=out)
                                check.check_returned(ret, out, "out")
                                result = out
                            if ctx.rank == root:
                                check.check(result, expected, dtype, op)
                            if ctx.rank != root or mode == "out-of-place":
                                check.check(buf, mine, dtype, None, "input changed")
    return check.lines


COLLECTIVES = {
    "allreduce": case_allreduce,
    "reduce_scatter": case_reduce_scatter,
    "allgather": case_allgather,
    "broadcast": case_broadcast,
    "reduce": case_reduce,
}


@pytest.mark.parametrize(
    ("size", "transport", "collective"),
    [pytest.param(n, t, c, id=f"{c}-ws{n}-{t}") for n, t in MATRIX for c in COLLECTIVES],
)
def test_collective(pools, size, transport, collective):
    """Every dtype x op x count in {0, 1, 7, 1000, 2**20+3} x mode, checked on every rank."""
    per_rank = pools.get(size, transport).run(COLLECTIVES[collective], DTYPES, OPS, COUNTS)
    assert_no_mismatch(per_rank)


# ---- alltoall, gather, scatter --------------------------------------------------------------


def uneven_counts(size: int, scale: int, salt: int) -> list[list[int]]:
    """counts[s][d]: elements s sends to d; about a fifth of them (some diagonal ones) are 0."""
    return [[((s * 7 + d * 3 + salt) % 5) * scale for d in range(size)] for s in range(size)]


def case_alltoall(ctx, dtypes, matrices):
    """``matrices``: list of (name, counts[s][d], pass_counts)."""
    check = Checker(ctx.rank, ctx.note)
    n, rank = ctx.size, ctx.rank
    for dtype in dtypes:
        for name, counts, pass_counts in matrices:
            send_counts = counts[rank]
            recv_counts = [counts[s][rank] for s in range(n)]
            mine = values(dtype, "bits", rank, 0, sum(send_counts))
            expected = np.concatenate(
                [
                    values(dtype, "bits", s, sum(counts[s][:rank]), sum(counts[s][: rank + 1]))
                    for s in range(n)
                ]
            )
            with check.case(f"alltoall {dtype} {name}"):
                buf = make_buffer(dtype, mine)
                out = sentinel_buffer(dtype, sum(recv_counts))
                if pass_counts:
                    ret = ctx.comm.alltoall(
                        buf, out, send_counts=send_counts, recv_counts=recv_counts
                    )
                else:
                    ret = ctx.comm.alltoall(buf, out)
                check.check_returned(ret, out, "out")
                check.check(out, expected, dtype)
                check.check(buf, mine, dtype, None, "input changed")
    return check.lines


@world_params(SMALL_WORLDS)
def test_alltoall(pools, size, transport):
    matrices = []
    for c in MOVE_COUNTS:
        equal = [[c] * size for _ in range(size)]
        matrices.append((f"equal split count={c} (counts omitted)", equal, False))
        matrices.append((f"equal split count={c} (counts given)", equal, True))
    for scale in (1, 100, 2**16 + 1):
        for salt in (0, 2):
            counts = uneven_counts(size, scale, salt)
            matrices.append((f"uneven counts={counts}", counts, True))
    zeros = [[0] * size for _ in range(size)]
    matrices.append(("all counts zero", zeros, True))
    one_sender = [[50 if s == 1 else 0 for _ in range(size)] for s in range(size)]
    matrices.append((f"only rank 1 sends, counts={one_sender}", one_sender, True))
    per_rank = pools.get(size, transport).run(case_alltoall, DTYPES, matrices)
    assert_no_mismatch(per_rank)


def case_gather(ctx, dtypes, counts):
    check = Checker(ctx.rank, ctx.note)
    n = ctx.size
    for dtype in dtypes:
        for count in counts:
            inputs = stacked(dtype, "bits", n, 0, count)
            for root in roots_of(n, count):
                for mode in ("out given", "out=None"):
                    with check.case(f"gather {dtype} count={count} root={root} {mode}"):
                        buf = make_buffer(dtype, inputs[ctx.rank])
                        out = None
                        if mode == "out given" and ctx.rank == root:
                            out = sentinel_buffer(dtype, n * count)
                        ret = ctx.comm.gather(buf, root=root, out=out)
                        if ctx.rank != root:
                            if ret is not None:
                                check.fail(f"non-root returned {type(ret).__name__}, not None")
                        elif out is not None and ret is not out:
                            check.fail("root did not return `out` itself")
                        elif not same_kind(ret, dtype, n * count):
                            check.fail(f"root returned {describe_buffer(ret)}")
                        else:
                            check.check(ret, inputs.reshape(-1), dtype)
                        check.check(buf, inputs[ctx.rank], dtype, None, "input changed")
    return check.lines


@world_params(SMALL_WORLDS)
def test_gather(pools, size, transport):
    assert_no_mismatch(pools.get(size, transport).run(case_gather, DTYPES, MOVE_COUNTS))


def case_scatter(ctx, dtypes, counts):
    check = Checker(ctx.rank, ctx.note)
    n, rank = ctx.size, ctx.rank
    for dtype in dtypes:
        for count in counts:
            for root in roots_of(n, count):
                with check.case(f"scatter {dtype} count={count} root={root}"):
                    source = values(dtype, "bits", root, 0, n * count)
                    buf = make_buffer(dtype, source) if rank == root else None
                    out = sentinel_buffer(dtype, count)
                    ret = ctx.comm.scatter(out, root=root, buf=buf)
                    check.check_returned(ret, out, "out")
                    check.check(out, source[rank * count : (rank + 1) * count], dtype)
                    if buf is not None:
                        check.check(buf, source, dtype, None, "root's buf changed")
    return check.lines


@world_params(SMALL_WORLDS)
def test_scatter(pools, size, transport):
    assert_no_mismatch(pools.get(size, transport).run(case_scatter, DTYPES, MOVE_COUNTS))


# ---- point to point -------------------------------------------------------------------------


def case_send_recv_ring(ctx, dtypes, counts, use_async):
    """Each rank sends to the right and receives from the left.

    sync: rank 0 sends first, the others receive first. async: every rank starts its send,
    then its receive, then waits for both."""
    check = Checker(ctx.rank, ctx.note)
    n, rank, comm = ctx.size, ctx.rank, ctx.comm
    right, left = (rank + 1) % n, (rank - 1) % n
    for dtype in dtypes:
        for count in counts:
            tag = count % 7 + 1
            with check.case(f"send/recv ring {dtype} count={count} tag={tag} async={use_async}"):
                data = make_buffer(dtype, values(dtype, "bits", rank, 0, count))
                inbox = sentinel_buffer(dtype, count)
                if use_async:
                    hs = comm.send(data, right, tag=tag, async_=True)
                    hr = comm.recv(inbox, peer=left, tag=tag, async_=True)
                    source = hr.wait(timeout=30)
                    hs.wait(timeout=30)
                elif rank == 0:
                    comm.send(data, right, tag=tag)
                    source = comm.recv(inbox, peer=left, tag=tag)
                else:
                    source = comm.recv(inbox, peer=left, tag=tag)
                    comm.send(data, right, tag=tag)
                if source != left:
                    check.fail(f"recv returned source {source!r}, expected {left}")
                check.check(inbox, values(dtype, "bits", left, 0, count), dtype)
    return check.lines


@world_params(SMALL_WORLDS)
@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_send_recv_ring(pools, size, transport, use_async):
    counts = (0, 1, 1000, 2**20 + 3)
    per_rank = pools.get(size, transport).run(case_send_recv_ring, DTYPES, counts, use_async)
    assert_no_mismatch(per_rank)


# Messages of up to 32 bytes travel in their shared-memory slot's header; these counts put
# messages on both sides of that size (int8: 4-33 bytes, float32: 16-132, float64: 32-264).
HEADER_BOUNDARY_COUNTS = (4, 8, 9, 31, 32, 33)
HEADER_BOUNDARY_DTYPES = ("np.int8", "np.float32", "np.float64")


@world_params([(2, "shm"), (3, "shm")])
def test_messages_around_the_slot_header_payload(pools, size, transport):
    pool = pools.get(size, transport)
    dtypes, counts = HEADER_BOUNDARY_DTYPES, HEADER_BOUNDARY_COUNTS
    assert_no_mismatch(pool.run(case_allreduce, dtypes, ("sum", "max"), counts))
    assert_no_mismatch(pool.run(case_send_recv_ring, dtypes, counts, False))


def case_recv_posted_before_send(ctx, count, wait_s):
    """The usual non-blocking exchange: post the receive from the left, then the send to the
    right, then wait for both. No rank can finish its receive before its right neighbour's
    send is issued behind that neighbour's own receive."""
    check = Checker(ctx.rank, ctx.note)
    n, rank = ctx.size, ctx.rank
    right, left = (rank + 1) % n, (rank - 1) % n
    with check.case(f"irecv(left) then isend(right), count={count}, waits of {wait_s} s"):
        inbox = np.full(count, -1, np.int64)
        hr = ctx.comm.recv(inbox, peer=left, tag=4, async_=True)
        hs = ctx.comm.send(np.full(count, rank, np.int64), right, tag=4, async_=True)
        source = hr.wait(timeout=wait_s)
        hs.wait(timeout=wait_s)
        if source != left:
            check.fail(f"recv returned source {source!r}, expected {left}")
        check.check(inbox, np.full(count, left, np.int64), "np.int64")
    return check.lines


@world_params(SMALL_WORLDS)
def test_recv_posted_before_send(pools, size, transport):
    per_rank = pools.get(size, transport).run(case_recv_posted_before_send, 1000, wait_s=10)
    assert_no_mismatch(per_rank)


def case_tags_in_order(ctx, count):
    """Rank 0 sends three differently tagged messages to rank 1, which receives them in order."""
    check = Checker(ctx.rank, ctx.note)
    tags = (0, 5, 2**20)
    with check.case(f"tagged send/recv count={count} tags={tags}"):
        if ctx.rank == 0:
            for tag in tags:
                ctx.comm.send(make_buffer("np.int32", np.full(count, tag, np.int32)), 1, tag=tag)
        elif ctx.rank == 1:
            for tag in tags:
                inbox = sentinel_buffer("np.int32", count)
                source = ctx.comm.recv(inbox, peer=0, tag=tag)
                if source != 0:
                    check.fail(f"tag {tag}: recv returned source {source!r}, expected 0")
                check.check(inbox, np.full(count, tag, np.int32), "np.int32", what=f"tag {tag}")
    return check.lines


def case_tags_out_of_order(ctx, count):
    """Rank 0 posts tag 5 then tag 7; rank 1 receives tag 7 first, then tag 5."""
    check = Checker(ctx.rank, ctx.note)
    with check.case(f"tag matching out of order count={count}"):
        if ctx.rank == 0:
            h5 = ctx.comm.send(np.full(count, 5, np.int64), 1, tag=5, async_=True)
            h7 = ctx.comm.send(np.full(count, 7, np.int64), 1, tag=7, async_=True)
            h5.wait(timeout=15)
            h7.wait(timeout=15)
        elif ctx.rank == 1:
            got7, got5 = np.zeros(count, np.int64), np.zeros(count, np.int64)
            h7 = ctx.comm.recv(got7, peer=0, tag=7, async_=True)
            h5 = ctx.comm.recv(got5, peer=0, tag=5, async_=True)
            h7.wait(timeout=15)
            h5.wait(timeout=15)
            check.check(got7, np.full(count, 7, np.int64), "np.int64", what="tag 7")
            check.check(got5, np.full(count, 5, np.int64), "np.int64", what="tag 5")
    return check.lines


@world_params(SMALL_WORLDS)
def test_send_recv_tags(pools, size, transport):
    pool = pools.get(size, transport)
    for count in (3, 2**20):
        assert_no_mismatch(pool.run(case_tags_in_order, count))


@world_params([(2, "shm"), (2, "tcp")])
@pytest.mark.parametrize("count", [3, 2**20])
def test_recv_matches_tag_out_of_order(pools, size, transport, count):
    assert_no_mismatch(pools.get(size, transport).run(case_tags_out_of_order, count))


def case_recv_any_source(ctx, count, rounds):
    """Every other rank sends its rank number to rank 0, which receives with peer=None."""
    check = Checker(ctx.rank, ctx.note)
    for r in range(rounds):
        with check.case(f"recv(peer=None) round {r} count={count}"):
            if ctx.rank == 0:
                seen = []
                for _ in range(ctx.size - 1):
                    inbox = np.full(count, -1, np.int64)
                    source = ctx.comm.recv(inbox, tag=r)
                    seen.append(source)
                    if source in range(1, ctx.size):
                        check.check(inbox, np.full(count, source, np.int64), "np.int64")
                if Counter(seen) != Counter(range(1, ctx.size)):
                    check.fail(f"sources returned {seen}, expected each of 1..{ctx.size - 1} once")
            else:
                ctx.comm.send(np.full(count, ctx.rank, np.int64), 0, tag=r)
    return check.lines


@world_params(SMALL_WORLDS)
def test_recv_any_source(pools, size, transport):
    pool = pools.get(size, transport)
    for count in (1, 100_000):
        assert_no_mismatch(pool.run(case_recv_any_source, count, rounds=3))


def case_messages_before_their_receives(ctx, count):
    """Rank 1 receives from every other rank messages that arrived before their receives were
    posted: they come while it waits for each sender's last message (tag 99), so they are set
    aside as their bytes arrive. Received afterwards, each is what was sent, byte for byte,
    tag by tag in the order sent, from a named rank or any. A message whose receive was posted
    first with the wrong size fails that receive, which says so, and is read and dropped
    without disturbing the messages behind it; one set aside fails a later receive of the
    wrong size the same way."""
    check = Checker(ctx.rank, ctx.note)
    comm, rank = ctx.comm, ctx.rank
    senders = [r for r in range(ctx.size) if r != 1]

    def payload(sender, tag, n):
        return np.arange(n, dtype=np.int64) + sender * 10**9 + tag * 10**7

    def refused(what, call, sent_bytes, buffer_bytes):
        try:
            call()
            check.fail(f"{what}: the receive succeeded")
        except Exception as exc:  # noqa: BLE001 - checked below
            text = str(exc)
            sizes = (f"{sent_bytes} bytes but the receive buffer", str(buffer_bytes))
            if not is_invalid_argument(exc) or not all(size in text for size in sizes):
                check.fail(f"{what}: raised {type(exc).__name__}: {text}")

    # (tag, elements) in the order each sender sends them.
    sent = [(5, count), (1, count), (2, 3), (1, 1000), (3, 0), (4, 1000), (99, 1)]
    with check.case(f"messages before their receives, count={count}"):
        if rank != 1:
            handles = [comm.send(payload(rank, t, n), 1, tag=t, async_=True) for t, n in sent]
            for handle in handles:
                handle.wait(timeout=30)
            return check.lines
        drained = {s: comm.recv(np.zeros(5, np.int64), peer=s, tag=5, async_=True) for s in senders}
        for s in senders:
            comm.recv(np.zeros(1, np.int64), peer=s, tag=99)
        for s, handle in drained.items():
            refused(f"tag 5 from rank {s}", lambda h=handle: h.wait(timeout=30), count * 8, 40)
        for s in senders:
            for tag, n in [(1, count), (1, 1000), (3, 0)]:
                inbox = np.full(n, -1, np.int64)
                source = comm.recv(inbox, peer=s, tag=tag)
                if source != s:
                    check.fail(f"tag {tag} from rank {s}: recv returned source {source!r}")
                check.check(inbox, payload(s, tag, n), "np.int64", what=f"tag {tag} from {s}")
        seen = []
        for _ in senders:
            inbox = np.full(3, -1, np.int64)
            source = comm.recv(inbox, tag=2)
            seen.append(source)
            if source in senders:
                check.check(inbox, payload(source, 2, 3), "np.int64", what=f"tag 2 from {source}")
        if sorted(seen) != senders:
            check.fail(f"any-source receives returned {seen}, expected each of {senders} once")
        wrong = np.zeros(999, np.int64)
        for s in senders:
            refused(f"tag 4 from rank {s}", lambda s=s: comm.recv(wrong, peer=s, tag=4), 8000, 7992)
    return check.lines


@world_params([(2, "shm"), (3, "tcp")])
def test_messages_before_their_receives(pools, size, transport):
    per_rank = pools.get(size, transport).run(case_messages_before_their_receives, 2**20 + 3)
    assert_no_mismatch(per_rank)


# ---- barrier --------------------------------------------------------------------------------


def case_barrier(ctx, delay_s, repeats):
    """Each rank in turn enters late (first, middle, last: the dissemination barrier's rounds
    reach each differently); returns, per turn, (the late rank, when it entered, when this
    rank left, barrier()'s return value)."""
    turns = []
    for late in sorted({0, ctx.size // 2, ctx.size - 1}):
        ctx.comm.barrier()
        if ctx.rank == late:
            time.sleep(delay_s)
        entered = time.time()
        ret = ctx.comm.barrier()
        turns.append((late, entered, time.time(), ret))
    for _ in range(repeats):
        ctx.comm.barrier()
    return turns


@world_params(SMALL_WORLDS)
def test_barrier(pools, size, transport):
    results = pools.get(size, transport).run(case_barrier, delay_s=0.2, repeats=50)
    problems = []
    for turn in range(len(results[0])):
        late = results[0][turn][0]
        late_entered = results[late][turn][1]
        for rank, turns in enumerate(results):
            _, _, left, ret = turns[turn]
            if ret is not None:
                problems.append(f"rank {rank}: barrier() returned {ret!r}")
            if left < late_entered:
                early = late_entered - left
                problems.append(
                    f"rank {rank} left the barrier {early:.3f} s before rank {late} entered it"
                )
    assert not problems, "\n".join(problems)


# ---- async handles --------------------------------------------------------------------------


def start_all_ops(ctx, dtype: str, count: int) -> list[tuple]:
    """Starts one async op of each kind.

    Returns [(name, handle, what wait() must return, buffer to check, expected, op)]."""
    import weft

    comm, n, rank = ctx.comm, ctx.size, ctx.rank
    small = stacked(dtype, "small", n, 0, count)
    bits = stacked(dtype, "bits", n, 0, count)
    wide = stacked(dtype, "small", n, 0, n * count)
    mine = slice(rank * count, (rank + 1) * count)
    started = []

    def add(name, handle, returns, buf, expected, op=None):
        if not isinstance(handle, weft.Handle):
            raise TypeError(f"{name}(async_=True) returned {type(handle).__name__}, not Handle")
        started.append((name, handle, returns, buf, expected, op))

    a = make_buffer(dtype, small[rank])
    add("allreduce", comm.allreduce(a, op="sum", async_=True), a, a, reduce_ref(small, "sum"))

    out = sentinel_buffer(dtype, n * count)
    handle = comm.allgather(make_buffer(dtype, bits[rank]), out=out, async_=True)
    add("allgather", handle, out, out, bits.reshape(-1))

    b = make_buffer(dtype, bits[n - 1] if rank == n - 1 else bits[rank] * 0)
    add("broadcast", comm.broadcast(b, root=n - 1, async_=True), b, b, bits[n - 1])

    out = sentinel_buffer(dtype, count)
    handle = comm.reduce_scatter(make_buffer(dtype, wide[rank]), op="max", out=out, async_=True)
    add("reduce_scatter", handle, out, out, reduce_ref(wide, "max")[mine], "max")

    r = make_buffer(dtype, small[rank])
    expected = reduce_ref(small, "min") if rank == 0 else small[rank]
    add("reduce", comm.reduce(r, root=0, op="min", async_=True), r, r, expected, "min")

    add("barrier", comm.barrier(async_=True), None, None, None)

    out = sentinel_buffer(dtype, n * count)
    handle = comm.alltoall(make_buffer(dtype, np.tile(bits[rank], n)), out, async_=True)
    add("alltoall", handle, out, out, bits.reshape(-1))

    out = sentinel_buffer(dtype, n * count) if rank == 0 else None
    handle = comm.gather(make_buffer(dtype, bits[rank]), root=0, out=out, async_=True)
    add("gather", handle, out, out, bits.reshape(-1))

    out = sentinel_buffer(dtype, count)
    buf = make_buffer(dtype, wide[n - 1]) if rank == n - 1 else None
    add("scatter", comm.scatter(out, root=n - 1, buf=buf, async_=True), out, out, wide[n - 1][mine])
    return started


def case_async_ops(ctx, dtypes, count, order):
    """Starts one async op of every kind, then waits in issue order or in reverse."""
    check = Checker(ctx.rank, ctx.note)
    for dtype in dtypes:
        with check.case(f"async ops {dtype} count={count} wait order={order}"):
            started = start_all_ops(ctx, dtype, count)
            handles = [entry[1] for entry in started]
            # A synchronous op issued behind the async ones must still be right.
            sync_buf = np.full(5, ctx.rank, np.int64)
            ctx.comm.allreduce(sync_buf)
            check.check(sync_buf, np.full(5, sum(range(ctx.size)), np.int64), "np.int64", "sum")
            if order == "reverse":
                results = [h.wait(timeout=60) for h in reversed(handles)][::-1]
            else:
                results = [h.wait() for h in handles]
            for (name, _, returns, buf, expected, op), result in zip(started, results):
                if result is not returns:
                    check.fail(
                        f"{name}: wait() returned {type(result).__name__}, not the sync result"
                    )
                if buf is not None:
                    check.check(buf, expected, dtype, op, what=name)
            not_done = [name for name, handle, *_ in started if handle.test() is not True]
            if not_done:
                check.fail(f"test() is not True after wait() for {not_done}")
    return check.lines


@world_params(SMALL_WORLDS)
@pytest.mark.parametrize("order", ["issue", "reverse"])
def test_async_ops(pools, size, transport, order):
    dtypes = ("np.float32", "np.int64", "np.float16", "torch.bfloat16", "torch.float32")
    for count in (1, 1000, 2**18 + 1):
        assert_no_mismatch(pools.get(size, transport).run(case_async_ops, dtypes, count, order))


def case_async_test_polls(ctx, count, limit_s):
    """test() turns True by itself (no wait() called) within ``limit_s``."""
    check = Checker(ctx.rank, ctx.note)
    with check.case(f"async allreduce count={count}, polling test()"):
        buf = np.full(count, ctx.rank + 1, np.float32)
        handle = ctx.comm.allreduce(buf, async_=True)
        deadline = time.monotonic() + limit_s
        polls = 0
        while not handle.test():
            polls += 1
            if time.monotonic() > deadline:
                check.fail(f"test() still False after {limit_s} s ({polls} polls)")
                break
            time.sleep(0.001)
        if handle.wait(timeout=60) is not buf:
            check.fail("wait() did not return buf")
        expected = np.full(count, sum(range(1, ctx.size + 1)), np.float32)
        check.check(buf, expected, "np.float32", "sum")
    return check.lines


@world_params(SMALL_WORLDS)
def test_async_test_polls(pools, size, transport):
    pool = pools.get(size, transport)
    for count in (1, 2**22):
        assert_no_mismatch(pool.run(case_async_test_polls, count, limit_s=60))


def case_send_recv_async(ctx):
    """Async send/recv between ranks 0 and 1: wait() returns None / the source rank."""
    check = Checker(ctx.rank, ctx.note)
    with check.case("async send/recv wait() results"):
        if ctx.rank == 0:
            result = ctx.comm.send(np.arange(10, dtype=np.int32), 1, tag=9, async_=True).wait()
            if result is not None:
                check.fail(f"send handle wait() returned {result!r}, expected None")
        elif ctx.rank == 1:
            inbox = np.zeros(10, np.int32)
            handle = ctx.comm.recv(inbox, peer=None, tag=9, async_=True)
            source = handle.wait()
            if source != 0:
                check.fail(f"recv handle wait() returned {source!r}, expected 0")
            check.check(inbox, np.arange(10, dtype=np.int32), "np.int32")
    return check.lines


@world_params(SMALL_WORLDS)
def test_send_recv_async(pools, size, transport):
    assert_no_mismatch(pools.get(size, transport).run(case_send_recv_async))


# ---- torch tensors: every type weft.Communicator takes, views into larger tensors -------------

TORCH_TYPES = ("float32", "float64", "float16", "bfloat16", "int8", "uint8", "int32", "int64")


def case_torch_tensor_views(ctx, count):
    """Allreduces (sum) a slice from the middle of a larger tensor, in place and into a slice
    of another: the result lands at the slice's offset and nothing around it changes. weft._C
    reads torch tensors through weft._C_torch in C++ (python/host_tensor.h), so this checks
    the pointer, size and type it reads for every type."""
    import torch

    check = Checker(ctx.rank, ctx.note)
    total = ctx.size * (ctx.size + 1) // 2
    for name in TORCH_TYPES:
        dtype = getattr(torch, name)
        for in_place in (True, False):
            with check.case(f"torch.{name} count={count} in_place={in_place}"):
                base = torch.full((count + 10,), 7, dtype=dtype)
                view = base[3 : 3 + count]
                view.fill_(ctx.rank + 1)
                outside = torch.full((count + 10,), 5, dtype=dtype)
                out = None if in_place else outside[4 : 4 + count]
                returned = ctx.comm.allreduce(view, out=out)
                result, around = (view, base) if in_place else (out, outside)
                expected = torch.full((count,), total, dtype=dtype)
                if returned is not result:
                    check.fail("allreduce did not return its destination")
                if not torch.equal(result, expected):
                    check.fail(f"result {result[:4].tolist()}..., expected {total}")
                start = 3 if in_place else 4
                fill = 7 if in_place else 5
                untouched = torch.cat([around[:start], around[start + count :]])
                if not torch.equal(untouched, torch.full_like(untouched, fill)):
                    check.fail("elements outside the slice changed")
    return check.lines


@pytest.mark.parametrize(
    ("size", "transport"), [(2, "shm"), (3, "tcp")], ids=["ws2-shm", "ws3-tcp"]
)
def test_torch_tensor_views(pools, size, transport):
    for count in (0, 1, 1009):
        assert_no_mismatch(pools.get(size, transport).run(case_torch_tensor_views, count))


# ---- communicator attributes and several communicators over one store ------------------------


def case_attributes(ctx):
    import weft

    comm = ctx.comm
    found = {"rank": comm.rank, "size": comm.size, "timeout": comm.timeout}
    found["step_bytes"] = comm.topology.step_bytes
    name = ctx.fresh_name("second")
    second = weft.Communicator(
        ctx.store, ctx.rank, ctx.size, name=name, timeout=timedelta(seconds=12.5)
    )
    found["second"] = {"rank": second.rank, "size": second.size, "timeout": second.timeout}
    # Interleave operations on the two communicators.
    a = np.full(100, ctx.rank + 1, np.int64)
    b = np.full(100, 10 * (ctx.rank + 1), np.int64)
    ha = comm.allreduce(a, async_=True)
    second.allreduce(b, op="max")
    ha.wait()
    found["sums"] = (int(a[0]), int(a[-1]), int(b[0]), int(b[-1]))
    return found


@world_params(SMALL_WORLDS)
def test_attributes_and_second_communicator(pools, size, transport):
    from weft_pool import COMM_TIMEOUT_S

    results = pools.get(size, transport).run(case_attributes)
    total = size * (size + 1) // 2
    for rank, found in enumerate(results):
        assert (found["rank"], found["size"]) == (rank, size)
        assert found["timeout"] == pytest.approx(COMM_TIMEOUT_S)
        assert isinstance(found["timeout"], float)
        assert found["second"] == {"rank": rank, "size": size, "timeout": pytest.approx(12.5)}
        assert found["sums"] == (total, total, 10 * size, 10 * size), f"rank {rank}"
        assert found["step_bytes"] == expected_step_bytes(size, transport), f"rank {rank}"


def expected_step_bytes(size: int, transport: str) -> int:
    """Half of what a connection can hold unanswered: 256 KiB x 8 over shm; over tcp 1 MiB x 4,
    or 256 KiB x 2 where more than two ranks per CPU share the machine (these pools' ranks all
    run here, whatever host identity they were given)."""
    if transport == "shm":
        return 256 * 1024 * 8 // 2
    crowded = size / len(os.sched_getaffinity(0)) > 2
    return 256 * 1024 * 2 // 2 if crowded else 1024 * 1024 * 4 // 2
