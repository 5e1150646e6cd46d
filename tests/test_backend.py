"""torch.distributed over weft against gloo, on real processes.

Every pool rank (weft_pool.py) holds the default process group over weft and a gloo group over
the same ranks (weft_torch.py); each case runs an operation on both with the same inputs and
reports any difference in results or in the exceptions raised. World sizes 2, 3 and 4.
"""

from __future__ import annotations

import functools
import threading
import time
from datetime import timedelta
from functools import partial

import pytest
import torch
import torch.distributed as dist
from weft_torch import (
    COUNTS,
    GLOO_BROADCASTS_COMPLEX,
    GLOO_GATHERS_NON_CONTIGUOUS,
    GLOO_HAS_AVG,
    GLOO_RAISES_ON_MIXED_DTYPES,
    GLOO_REDUCE_SCATTERS,
    GLOO_REFUSES_NON_CONTIGUOUS_ALL_TO_ALL,
    INTEGRAL,
    OPS,
    REDUCE_DTYPES,
    Twins,
    assert_same,
    flat_tensors,
    groups,
    reducible,
    seed_of,
    values,
)

WORLDS = [pytest.param(n, "shm", id=f"ws{n}") for n in (2, 3, 4)]
MOVE_DTYPES = (torch.float32, torch.float16, torch.int64, torch.uint8, torch.bool)
AVG = dist.ReduceOp.AVG


def world_params(fn):
    return pytest.mark.parametrize(("size", "transport"), WORLDS)(fn)


def wait(work) -> None:
    if work is not None:
        work.wait()


def tensors(*specs):
    """Arguments for an operation: one tensor per (shape, dtype, seed)."""
    return tuple(values(shape, dtype, seed) for shape, dtype, seed in specs)


def tensor_lists(n, shape, dtype, seed):
    """(list of n input tensors,) with distinct values."""
    return ([values(shape, dtype, seed + i) for i in range(n)],)


def transposed(shape, dtype, seed):
    """(non-contiguous tensor,)"""
    return (values(shape[::-1], dtype, seed).t(),)


# ---- reductions -----------------------------------------------------------------------------


def all_reduce(group, x, op, async_op=False):
    wait(dist.all_reduce(x, op=op, group=group, async_op=async_op))


def pg_allreduce_list(group, xs, op):
    opts = dist.AllreduceOptions()
    opts.reduceOp = op
    group.allreduce(xs, opts).wait()


def coalesced_inputs(dtype, seed):
    shapes = [(0,), (1,), (7,), (3, 5), (1031,)]
    return ([values(s, dtype, seed + i) for i, s in enumerate(shapes)],)


def reducing(run, op, gloo_has_avg=GLOO_HAS_AVG):
    """``run`` with ``op``, where the first argument of ``run`` is the output. gloo has no
    AVG before torch 2.8 (nor where its side is computed here, see ``computed``): there its
    side runs SUM and divides the output in place by the world size on every rank, as later
    gloo does (so refusing integer tensors as it does)."""
    if op != AVG or gloo_has_avg:
        return partial(run, op=op)

    def run_avg(group, output, *args, **kwargs):
        if dist.get_backend(group) != "gloo":
            return run(group, output, *args, op=op, **kwargs)
        result = run(group, output, *args, op=dist.ReduceOp.SUM, **kwargs)
        for t in flat_tensors(output):
            t.div_(dist.get_world_size(group))
        return result

    return run_avg


def avg_rules(op, dtype) -> dict:
    """AVG results are compared approximately; weft also averages integers (truncating, as
    NCCL does) where gloo fails."""
    if op != AVG:
        return {}
    return {"approx": True, "weft_may_accept": dtype in INTEGRAL and dtype != torch.bool}


def all_reduce_coalesced(group, xs, op):
    dist.all_reduce_coalesced(xs, op=op, group=group)


def case_all_reduce(ctx):
    t = Twins(ctx)
    for dtype in REDUCE_DTYPES:
        for op in OPS:
            if not reducible(op, dtype):
                t.same(
                    f"all_reduce {dtype} {op} refused",
                    partial(tensors, ((3,), dtype, 1)),
                    partial(all_reduce, op=op),
                )
                continue
            for count in COUNTS:
                modes = (False, True) if count in (7, 65537) else (False,)
                for async_op in modes:
                    t.same(
                        f"all_reduce {dtype} {op} count={count} async={async_op}",
                        partial(tensors, ((count,), dtype, seed_of(ctx.rank, count, dtype))),
                        partial(reducing(all_reduce, op), async_op=async_op),
                        **avg_rules(op, dtype),
                    )
            t.same(
                f"all_reduce {dtype} {op} non-contiguous",
                partial(transposed, (5, 3), dtype, seed_of(ctx.rank, dtype)),
                reducing(all_reduce, op),
                **avg_rules(op, dtype),
            )
            t.same(
                f"allreduce list of 3 {dtype} {op}",
                partial(tensor_lists, 3, (7,), dtype, seed_of(ctx.rank, dtype)),
                partial(pg_allreduce_list, op=op),
                # gloo divides only the first tensor of the list by the world size.
                weft_refuses=op == AVG,
            )
            t.same(
                f"all_reduce_coalesced {dtype} {op}",
                partial(coalesced_inputs, dtype, ctx.rank),
                reducing(all_reduce_coalesced, op),
                **avg_rules(op, dtype),
            )
    for op in (dist.ReduceOp.SUM, AVG):
        t.same(
            f"all_reduce complex64 {op}",
            lambda: (
                torch.complex(values((7,), torch.float32, 1), values((7,), torch.float32, 2)),
            ),
            reducing(all_reduce, op),
            approx=True,
        )
    t.same(
        "all_reduce PREMUL_SUM refused",
        partial(tensors, ((3,), torch.float32, 1)),
        partial(all_reduce, op=dist._make_nccl_premul_sum(2.0)),
    )
    t.same(
        "all_reduce uint16 refused",
        partial(tensors, ((3,), torch.int16, 1)),
        partial(all_reduce, op=dist.ReduceOp.SUM),
    )
    return t.lines


def reduce(group, x, dst, op, async_op=False):
    wait(dist.reduce(x, dst=dst, op=op, group=group, async_op=async_op))
    return [x] if dist.get_rank() == dst else []


def case_reduce(ctx):
    t = Twins(ctx)
    for dst in sorted({0, ctx.size - 1}):
        for dtype in REDUCE_DTYPES:
            for op in OPS:
                if not reducible(op, dtype):
                    continue
                for count in (0, 7, 65537):
                    t.same(
                        f"reduce dst={dst} {dtype} {op} count={count}",
                        partial(tensors, ((count,), dtype, seed_of(ctx.rank, count, dtype))),
                        partial(reducing(reduce, op), dst=dst, async_op=count == 7),
                        **avg_rules(op, dtype),
                    )
        t.same(
            f"reduce dst={dst} non-contiguous",
            partial(transposed, (4, 3), torch.float32, ctx.rank),
            partial(reduce, dst=dst, op=dist.ReduceOp.SUM),
        )
    return t.lines


def reduce_scatter(group, out, inputs, op, async_op=False):
    wait(dist.reduce_scatter(out, inputs, op=op, group=group, async_op=async_op))
    return out


def reduce_scatter_tensor(group, out, inp, op, async_op=False, single=False):
    fn = getattr(dist, "reduce_scatter_single", None) if single else dist.reduce_scatter_tensor
    wait(fn(out, inp, op=op, group=group, async_op=async_op))
    return out


def reduce_scatter_coalesced(group, outs, inps, op):
    with dist._coalescing_manager(group=group, async_ops=True) as cm:
        for out, inp in zip(outs, inps):
            dist.reduce_scatter_tensor(out, inp, op=op, group=group)
    cm.wait()
    return outs


# Each ReduceOp but AVG (see reducing) as an elementwise torch function of two tensors of one
# dtype (bool SUM and PRODUCT: logical or and and, as in gloo).
PAIRWISE = {
    dist.ReduceOp.SUM: torch.add,
    dist.ReduceOp.PRODUCT: torch.mul,
    dist.ReduceOp.MIN: torch.minimum,
    dist.ReduceOp.MAX: torch.maximum,
    dist.ReduceOp.BAND: torch.bitwise_and,
    dist.ReduceOp.BOR: torch.bitwise_or,
    dist.ReduceOp.BXOR: torch.bitwise_xor,
}


def computed(run, contribution):
    """``run``, a reduce_scatter, with gloo's side computed here instead: rank r's output is
    the reduction of ``contribution(s, r)`` over every rank s (the part of rank s's input
    that goes to rank r). For gloo releases that lack the operation or get it wrong. AVG
    comes here as SUM (wrap it in ``reducing`` with gloo_has_avg=False)."""

    def run_or_compute(group, out, inputs, op, async_op=False):
        if dist.get_backend(group) != "gloo":
            return run(group, out, inputs, op=op, async_op=async_op)
        rank, n = dist.get_rank(group), dist.get_world_size(group)
        out.copy_(functools.reduce(PAIRWISE[op], [contribution(s, rank) for s in range(n)]))
        return out

    return run_or_compute


def case_reduce_scatter(ctx):
    t = Twins(ctx)
    n = ctx.size
    for dtype in REDUCE_DTYPES:
        for op in OPS:
            if not reducible(op, dtype):
                continue
            for count in (0, 1, 7, 1031):

                def inputs_of(rank, c=count, d=dtype):
                    """Rank ``rank``'s input list (one tensor per rank)."""
                    return [values((c,), d, seed_of(rank, d, c) + i) for i in range(n)]

                def input_of(rank, c=count, d=dtype):
                    """Rank ``rank``'s input tensor (n * count elements)."""
                    return values((n * c,), d, seed_of(rank, d, c))

                lists, tensor = reduce_scatter, reduce_scatter_tensor
                gloo_has_avg = GLOO_HAS_AVG and GLOO_REDUCE_SCATTERS
                if not GLOO_REDUCE_SCATTERS:
                    lists = computed(lists, lambda s, r, f=inputs_of: f(s)[r])
                    tensor = computed(
                        tensor, lambda s, r, f=input_of, c=count: f(s)[r * c : (r + 1) * c]
                    )
                t.same(
                    f"reduce_scatter list {dtype} {op} count={count}",
                    lambda c=count, d=dtype, f=inputs_of: (torch.zeros(c, dtype=d), f(ctx.rank)),
                    partial(reducing(lists, op, gloo_has_avg), async_op=count == 7),
                    **avg_rules(op, dtype),
                )
                t.same(
                    f"reduce_scatter_tensor {dtype} {op} count={count}",
                    lambda c=count, d=dtype, f=input_of: (torch.zeros(c, dtype=d), f(ctx.rank)),
                    partial(reducing(tensor, op, gloo_has_avg), async_op=count == 7),
                    **avg_rules(op, dtype),
                )
    if hasattr(dist, "reduce_scatter_single"):
        t.same(
            "reduce_scatter_single",
            lambda: (torch.zeros(5), values((n * 5,), torch.float32, ctx.rank)),
            partial(reduce_scatter_tensor, op=dist.ReduceOp.SUM, single=True),
        )
    # The output's dtype differs from the input's, which gloo refuses; before torch 2.10 its
    # refusal is a failed CHECK that aborts the process.
    what = "reduce_scatter_tensor 2-d output"
    make = lambda: (torch.zeros(3, 2), values((3 * n, 2), torch.int64, ctx.rank))  # noqa: E731
    run = partial(reduce_scatter_tensor, op=dist.ReduceOp.MAX)
    if GLOO_RAISES_ON_MIXED_DTYPES:
        t.same(what, make, run)
    else:
        t.refused(what, make, run)
    t.same(
        "reduce_scatter_tensor coalesced",
        lambda: (
            [torch.zeros(c) for c in (1, 7, 0)],
            [values((n * c,), torch.float32, ctx.rank + c) for c in (1, 7, 0)],
        ),
        partial(reduce_scatter_coalesced, op=dist.ReduceOp.SUM),
    )
    return t.lines


# ---- data movement --------------------------------------------------------------------------


def broadcast(group, x, src, async_op=False):
    wait(dist.broadcast(x, src=src, group=group, async_op=async_op))


def case_broadcast(ctx):
    t = Twins(ctx)
    for src in range(ctx.size):
        for dtype in (*REDUCE_DTYPES, torch.complex64):
            for count in COUNTS:
                what = f"broadcast src={src} {dtype} count={count}"
                make = partial(tensors, ((count,), dtype, seed_of(ctx.rank, count)))
                run = partial(broadcast, src=src, async_op=count == 7)
                if dtype.is_complex and not GLOO_BROADCASTS_COMPLEX:
                    # Every rank ends with the source's tensor.
                    t.expect(what, make, run, tensors(((count,), dtype, seed_of(src, count))))
                else:
                    t.same(what, make, run)
        t.same(
            f"broadcast src={src} non-contiguous",
            partial(transposed, (4, 3), torch.float64, ctx.rank),
            partial(broadcast, src=src),
        )
        # gloo has no kernels for these types; weft moves their bytes.
        for dtype in (torch.uint16, torch.float8_e4m3fn):
            t.same(
                f"broadcast src={src} {dtype}",
                lambda d=dtype: (values((10,), torch.uint8, ctx.rank).view(d),),
                partial(broadcast, src=src),
                weft_may_accept=True,
            )
    return t.lines


def all_gather(group, outs, x, async_op=False):
    wait(dist.all_gather(outs, x, group=group, async_op=async_op))
    return outs


def all_gather_into_tensor(group, out, x, async_op=False, single=False):
    fn = getattr(dist, "all_gather_single", None) if single else dist.all_gather_into_tensor
    wait(fn(out, x, group=group, async_op=async_op))
    return out


def all_gather_coalesced(group, out_lists, xs):
    dist.all_gather_coalesced(out_lists, xs, group=group)
    return out_lists


def all_gather_into_tensor_coalesced(group, outs, xs):
    with dist._coalescing_manager(group=group, async_ops=True) as cm:
        for out, x in zip(outs, xs):
            dist.all_gather_into_tensor(out, x, group=group)
    cm.wait()
    return outs


def case_all_gather(ctx):
    t = Twins(ctx)
    n = ctx.size
    for dtype in MOVE_DTYPES:
        for count in COUNTS:
            seed = seed_of(ctx.rank, dtype, count)
            t.same(
                f"all_gather {dtype} count={count}",
                lambda c=count, d=dtype, s=seed: (
                    [torch.zeros(c, dtype=d) for _ in range(n)],
                    values((c,), d, s),
                ),
                partial(all_gather, async_op=count == 7),
            )
            t.same(
                f"all_gather into views of one tensor {dtype} count={count}",
                lambda c=count, d=dtype, s=seed: (
                    list(torch.zeros(n, c, dtype=d).unbind(0)),
                    values((c,), d, s),
                ),
                all_gather,
            )
            t.same(
                f"all_gather_into_tensor {dtype} count={count}",
                lambda c=count, d=dtype, s=seed: (torch.zeros(n * c, dtype=d), values((c,), d, s)),
                partial(all_gather_into_tensor, async_op=count == 7),
            )
    t.same(
        "all_gather non-contiguous input",
        lambda: ([torch.zeros(3, 4) for _ in range(n)], *transposed((4, 3), torch.float32, 5)),
        all_gather,
    )
    t.same(
        "all_gather_into_tensor 2-d, non-contiguous input",
        lambda: (torch.zeros(4 * n, 3), *transposed((4, 3), torch.float32, ctx.rank)),
        all_gather_into_tensor,
    )
    if hasattr(dist, "all_gather_single"):
        t.same(
            "all_gather_single",
            lambda: (torch.zeros(n * 5, dtype=torch.int32), values((5,), torch.int32, ctx.rank)),
            partial(all_gather_into_tensor, single=True),
        )
    shapes = [(0,), (1,), (7,), (2, 3)]
    t.same(
        "all_gather_coalesced",
        lambda: (
            [[torch.zeros(s) for s in shapes] for _ in range(n)],
            [values(s, torch.float32, ctx.rank + i) for i, s in enumerate(shapes)],
        ),
        all_gather_coalesced,
    )
    t.same(
        "all_gather_into_tensor coalesced",
        lambda: (
            [torch.zeros(n * c) for c in (1, 7, 0)],
            [values((c,), torch.float32, ctx.rank + c) for c in (1, 7, 0)],
        ),
        all_gather_into_tensor_coalesced,
    )
    t.same(
        "all_gather mismatched output size refused",
        lambda: ([torch.zeros(3) for _ in range(n - 1)] + [torch.zeros(4)], torch.ones(3)),
        all_gather,
    )
    return t.lines


def all_to_all_single(group, out, x, out_splits=None, in_splits=None, async_op=False):
    wait(dist.all_to_all_single(out, x, out_splits, in_splits, group=group, async_op=async_op))
    return out


def all_to_all(group, outs, xs, async_op=False):
    wait(dist.all_to_all(outs, xs, group=group, async_op=async_op))
    return outs


def uneven(size: int, salt: int) -> list[list[int]]:
    """rows[s][d]: rows rank s sends to rank d, some of them 0."""
    return [[(s * 7 + d * 3 + salt) % 4 for d in range(size)] for s in range(size)]


def case_all_to_all(ctx):
    t = Twins(ctx)
    n, r = ctx.size, ctx.rank
    for dtype in MOVE_DTYPES:
        for rows in (0, 1, 7):
            t.same(
                f"all_to_all_single even {dtype} rows={rows}",
                lambda k=rows, d=dtype: (
                    torch.zeros(n * k, 3, dtype=d),
                    values((n * k, 3), d, seed_of(r, k)),
                ),
                partial(all_to_all_single, async_op=rows == 7),
            )
        for salt in (0, 1):
            counts = uneven(n, salt)
            sends = counts[r]
            recvs = [counts[s][r] for s in range(n)]
            t.same(
                f"all_to_all_single splits {dtype} {counts}",
                lambda d=dtype, sends=sends, recvs=recvs: (
                    torch.zeros(sum(recvs), 2, dtype=d),
                    values((sum(sends), 2), d, seed_of(r, sends)),
                ),
                partial(all_to_all_single, out_splits=recvs, in_splits=sends),
            )
            # gloo wants every tensor of the lists the same size; weft does not.
            t.expect(
                f"all_to_all uneven list {dtype} {counts}",
                lambda d=dtype, sends=sends, recvs=recvs: (
                    [torch.zeros(k, dtype=d) for k in recvs],
                    [values((k,), d, seed_of(r, i)) for i, k in enumerate(sends)],
                ),
                partial(all_to_all, async_op=salt == 1),
                [values((counts[s][r],), dtype, seed_of(s, r)) for s in range(n)],
            )
        for k in (0, 1, 7):
            t.expect(
                f"all_to_all list {dtype} size={k}",
                lambda d=dtype, k=k: (
                    [torch.zeros(k, 2, dtype=d) for _ in range(n)],
                    [values((k, 2), d, seed_of(r, k, i)) for i in range(n)],
                ),
                partial(all_to_all, async_op=k == 1),
                [values((k, 2), dtype, seed_of(s, k, r)) for s in range(n)],
            )
    what = "all_to_all_single non-contiguous refused"
    make = lambda: (torch.zeros(4 * n, 3), *transposed((4 * n, 3), torch.float32, r))  # noqa: E731
    if GLOO_REFUSES_NON_CONTIGUOUS_ALL_TO_ALL:
        t.same(what, make, all_to_all_single)
    else:
        t.refused(what, make, all_to_all_single, error=ValueError)
    # gloo moves the blocks of one tensor over each other, leaving some ranks wrong data.
    t.refused(
        "all_to_all_single in place refused",
        lambda: (values((2 * n, 3), torch.float32, r),),
        lambda group, x: all_to_all_single(group, x, x),
        error=ValueError,
    )
    return t.lines


def gather(group, x, outs, dst, async_op=False):
    mine = outs if dist.get_rank() == dst else None
    wait(dist.gather(x, mine, dst=dst, group=group, async_op=async_op))
    return mine or []


def scatter(group, out, ins, src, async_op=False):
    wait(
        dist.scatter(
            out, ins if dist.get_rank() == src else None, src=src, group=group, async_op=async_op
        )
    )
    return out


def case_gather_scatter(ctx):
    t = Twins(ctx)
    n, r = ctx.size, ctx.rank
    for root in range(n):
        for dtype in MOVE_DTYPES:
            for count in (0, 1, 7, 1031):
                t.same(
                    f"gather dst={root} {dtype} count={count}",
                    lambda c=count, d=dtype: (
                        values((c,), d, seed_of(r, c)),
                        [torch.zeros(c, dtype=d) for _ in range(n)],
                    ),
                    partial(gather, dst=root, async_op=count == 7),
                )
                t.same(
                    f"scatter src={root} {dtype} count={count}",
                    lambda c=count, d=dtype: (
                        torch.zeros(c, dtype=d),
                        [values((c,), d, seed_of(r, c, i)) for i in range(n)],
                    ),
                    partial(scatter, src=root, async_op=count == 7),
                )
        what = f"gather dst={root} non-contiguous"
        make = lambda: (  # noqa: E731
            *transposed((4, 3), torch.float32, r),
            [torch.zeros(4, 3) for _ in range(n)],
        )
        if GLOO_GATHERS_NON_CONTIGUOUS:
            t.same(what, make, partial(gather, dst=root))
        else:
            # The root's list holds every rank's input, element for element.
            inputs = [transposed((4, 3), torch.float32, s)[0] for s in range(n)]
            t.expect(what, make, partial(gather, dst=root), inputs if r == root else [])
        # gloo writes a non-contiguous output's memory as if it were contiguous; weft fills
        # the tensor element by element.
        out = torch.zeros(4, 3).t()
        ins = [values((3, 4), torch.float32, seed_of(r, i)) for i in range(n)]
        scatter(t.groups.weft, out, ins, src=root)
        expected = values((3, 4), torch.float32, seed_of(root, r))
        t.check(f"scatter src={root} non-contiguous output", torch.equal(out, expected))
    return t.lines


# ---- point-to-point -------------------------------------------------------------------------


def ring(group, x, out, mode):
    """Sends x to the next rank, receives the previous rank's into out."""
    rank, n = dist.get_rank(), dist.get_world_size()
    nxt, prev = (rank + 1) % n, (rank - 1) % n
    if mode == "blocking":
        if rank % 2 == 0:
            dist.send(x, nxt, group=group)
            dist.recv(out, prev, group=group)
        else:
            dist.recv(out, prev, group=group)
            dist.send(x, nxt, group=group)
    elif mode == "isend":
        works = [dist.irecv(out, prev, group=group), dist.isend(x, nxt, group=group)]
        for w in works:
            w.wait()
    else:
        ops = [
            dist.P2POp(dist.irecv, out, prev, group=group, tag=3),
            dist.P2POp(dist.isend, x, nxt, group=group, tag=3),
        ]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
    return out


def any_source(group, x, out):
    """Every rank sends to rank 0, which receives from any source; returns what and whom."""
    rank, n = dist.get_rank(), dist.get_world_size()
    if rank != 0:
        dist.send(x, 0, group=group)
        return []
    got = {}
    for _ in range(n - 1):
        buf = torch.zeros_like(out)
        source = dist.recv(buf, group=group)
        got[source] = buf
    return [got[s] for s in sorted(got)] + [torch.tensor(sorted(got))]


def tags(group, x, out):
    """Two messages with different tags, received in the other order."""
    rank, n = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        dist.send(x, n - 1, group=group, tag=1)
        dist.send(x + 1, n - 1, group=group, tag=2)
        return []
    if rank == n - 1:
        second = torch.zeros_like(out)
        w2 = dist.irecv(second, 0, group=group, tag=2)
        w1 = dist.irecv(out, 0, group=group, tag=1)
        w2.wait()
        w1.wait()
        return [out, second]
    return []


def with_negative_tag(group, x, op):
    """A send, a receive or a receive from any source with tag -1: refused on every rank."""
    rank, n = dist.get_rank(), dist.get_world_size()
    if op == "send":
        dist.send(x, (rank + 1) % n, group=group, tag=-1)
    elif op == "recv":
        dist.recv(x, (rank - 1) % n, group=group, tag=-1)
    else:
        dist.recv(x, group=group, tag=-1)


def send_next(group, x):
    dist.send(x, (dist.get_rank() + 1) % dist.get_world_size(), group=group)


def case_p2p(ctx):
    t = Twins(ctx)
    for dtype in MOVE_DTYPES:
        for count in (0, 1, 7, 65537):
            for mode in ("blocking", "isend", "batch"):
                t.same(
                    f"send/recv ring {mode} {dtype} count={count}",
                    lambda c=count, d=dtype: (
                        values((c,), d, seed_of(ctx.rank, c)),
                        torch.zeros(c, dtype=d),
                    ),
                    partial(ring, mode=mode),
                )
    t.same(
        "recv from any source",
        lambda: (values((5,), torch.int32, ctx.rank), torch.zeros(5, dtype=torch.int32)),
        any_source,
    )
    t.same("tags", lambda: (values((3,), torch.float32, 1), torch.zeros(3)), tags)
    for op in ("send", "recv", "recv from any source"):
        t.same(
            f"{op} with a negative tag",
            lambda: (torch.zeros(2),),
            partial(with_negative_tag, op=op),
        )
    t.same("send non-contiguous refused", partial(transposed, (3, 2), torch.float32, 1), send_next)
    return t.lines


# ---- object collectives, barriers ------------------------------------------------------------


def objects(group):
    rank, n = dist.get_rank(), dist.get_world_size()
    mine = {"rank": rank, "data": list(range(rank + 2)), "text": "x" * (rank * 37)}
    gathered = [None] * n
    dist.all_gather_object(gathered, mine, group=group)
    listed = [mine, "second"] if rank == n - 1 else [None, None]
    dist.broadcast_object_list(listed, src=n - 1, group=group)
    at_root = [None] * n if rank == 0 else None
    dist.gather_object(mine, at_root, dst=0, group=group)
    scattered = [None]
    dist.scatter_object_list(
        scattered, [f"to {i}" for i in range(n)] if rank == 0 else None, src=0, group=group
    )
    received = [None]
    if rank == 0:
        dist.send_object_list([mine], dst=n - 1, group=group)
    elif rank == n - 1:
        dist.recv_object_list(received, src=0, group=group)
    return [torch.tensor(list(repr((gathered, listed, at_root, scattered, received)).encode()))]


def barriers(group):
    dist.barrier(group=group)
    wait(dist.barrier(group=group, async_op=True))
    group.monitored_barrier(timedelta(seconds=20), wait_all_ranks=True)
    group.monitored_barrier(timedelta(seconds=20))


def case_objects_and_barriers(ctx):
    t = Twins(ctx)
    t.same("object collectives", tuple, objects)
    t.same("barriers", tuple, barriers)
    return t.lines


# ---- subgroups ------------------------------------------------------------------------------


def subgroup_ops(group, x):
    """A few collectives on a subgroup; empty for ranks outside it."""
    if group is None or group == dist.GroupMember.NON_GROUP_MEMBER:
        return []
    n = dist.get_world_size(group)
    y = x.clone()
    dist.all_reduce(y, group=group)
    z = x.clone()
    dist.broadcast(z, src=dist.get_global_rank(group, n - 1), group=group)
    gathered = [torch.zeros_like(x) for _ in range(n)]
    dist.all_gather(gathered, x, group=group)
    swapped = torch.zeros(n * 2)
    dist.all_to_all_single(swapped, torch.arange(n * 2.0) + 100 * dist.get_rank(), group=group)
    return [y, z, *gathered, swapped, torch.tensor([dist.get_rank(group), n])]


def layouts(size: int) -> list[list[int]]:
    layouts = [list(range(size - 1)), list(range(1, size, 2)), [size - 1, 0]]
    return [ranks for ranks in layouts if ranks]


def case_subgroups(ctx):
    t = Twins(ctx)
    for ranks in layouts(ctx.size):
        twins = {b: dist.new_group(ranks, backend=b) for b in ("weft", "gloo")}
        t.same(
            f"subgroup {ranks}",
            lambda: (values((7,), torch.float32, ctx.rank),),
            lambda group, x, twins=twins: subgroup_ops(
                twins["weft" if group is t.groups.weft else "gloo"], x
            ),
        )
    subgroup_size = 2 if ctx.size % 2 == 0 else 1
    twins = {b: dist.new_subgroups(subgroup_size, backend=b)[0] for b in ("weft", "gloo")}
    t.same(
        f"new_subgroups({subgroup_size})",
        lambda: (values((7,), torch.int64, ctx.rank),),
        lambda group, x: subgroup_ops(twins["weft" if group is t.groups.weft else "gloo"], x),
    )
    return t.lines


# ---- timeout and errors ---------------------------------------------------------------------

TIMEOUT_S = 2.0


def case_timeout(ctx, set_later):
    """Rank 0 runs all_reduce on a group where nobody else does: DistBackendError naming the
    op and a peer, after the group's timeout and not much later. ``set_later``: the group
    starts with a minute and gets the timeout from ProcessGroup.set_timeout."""
    groups(ctx)
    timeout = timedelta(seconds=TIMEOUT_S)
    group = dist.new_group(backend="weft", timeout=timedelta(seconds=60) if set_later else timeout)
    if set_later:
        group.set_timeout(timeout)
    outcome = None
    if ctx.rank == 0:
        start = time.monotonic()
        try:
            dist.all_reduce(torch.ones(4), group=group)
            outcome = ("returned", 0.0, "")
        except Exception as exc:  # noqa: BLE001 - described to the parent
            outcome = (type(exc).__name__, time.monotonic() - start, str(exc))
    dist.barrier(group=groups(ctx).gloo)  # peers keep their connections open until then
    dist.destroy_process_group(group)
    return outcome


def case_abort(ctx):
    """Rank 0 runs all_reduce on a group where nobody else does, then aborts the group from
    another thread: the operation fails at once, not after the group's timeout, and so do
    later operations, on every rank. Returns (problems, seconds from abort to the failure)."""
    gloo = groups(ctx).gloo
    group = dist.new_group(backend="weft", timeout=timedelta(seconds=60))
    dist.all_reduce(torch.ones(1), group=group)
    problems, elapsed = [], 0.0
    if ctx.rank == 0:
        work = dist.all_reduce(torch.ones(1000), group=group, async_op=True)
        aborted_at = []
        aborter = threading.Timer(0.3, lambda: (aborted_at.append(time.monotonic()), group.abort()))
        aborter.start()
        try:
            work.wait()
            problems.append("the all_reduce nobody joined returned")
        except dist.DistBackendError as exc:
            elapsed = time.monotonic() - aborted_at[0]
            if "abort" not in str(exc):
                problems.append(f"the failure does not say the group was aborted: {exc}")
        aborter.join()
    dist.barrier(group=gloo)  # rank 0 has aborted
    try:
        dist.all_reduce(torch.ones(1), group=group)
        problems.append(f"rank {ctx.rank}: an all_reduce after the abort returned")
    except dist.DistBackendError:
        pass
    dist.barrier(group=gloo)
    dist.destroy_process_group(group)
    return problems, elapsed


def case_p2p_timeouts(ctx):
    """A receive whose message never comes fails after the group's timeout, even while other
    messages keep arriving, and only it fails: it is withdrawn, so the next receive with its
    tag gets the next message, and the group goes on working. A monitored barrier that one
    rank reached late fails where gloo's does and leaves nothing behind: the next one passes.
    Returns (what failed, seconds the stale receive took) per rank."""
    import weft

    gloo = groups(ctx).gloo
    group = dist.new_group(backend="weft", timeout=timedelta(seconds=TIMEOUT_S))
    rank, n = ctx.rank, ctx.size
    problems, elapsed = [], 0.0
    if rank == 0:
        start = time.monotonic()
        try:
            dist.irecv(torch.zeros(1), 1, group=group, tag=7).wait()
            problems.append("a receive nobody sends to returned")
        except dist.DistBackendError as exc:
            elapsed = time.monotonic() - start
            if "recv" not in str(exc) or "rank 1" not in str(exc):
                problems.append(f"the timeout does not name the op and peer: {exc}")
        sent = torch.zeros(1)
        dist.recv(sent, 1, group=group, tag=9)
        for k in range(int(sent)):
            other = torch.zeros(1)
            dist.recv(other, 1, group=group, tag=8)
            if other.item() != k:
                problems.append(f"message {k} with tag 8 carried {other.item()}")
    elif rank == 1:
        count, end = 0, time.monotonic() + TIMEOUT_S + 0.5
        while time.monotonic() < end:  # other traffic while rank 0's receive waits
            dist.send(torch.full((1,), float(count)), 0, group=group, tag=8)
            count += 1
            time.sleep(0.02)
        dist.send(torch.full((1,), float(count)), 0, group=group, tag=9)
    dist.barrier(group=gloo)
    if rank == 1:
        dist.send(torch.full((1,), 42.0), 0, group=group, tag=7)
    elif rank == 0:
        fresh = torch.zeros(1)
        dist.recv(fresh, 1, group=group, tag=7)
        if fresh.item() != 42:
            problems.append(f"the receive after the timeout got {fresh.item()}, not 42")
    total = torch.ones(1)
    dist.all_reduce(total, group=group)
    if total.item() != n:
        problems.append(f"all_reduce after the timeout gave {total.item()}")

    late = rank == n - 1
    if late:
        dist.barrier(group=gloo)  # the others' barrier has failed by now
    try:
        weft.monitored_barrier(group, timeout=timedelta(seconds=1))
        problems.append("the monitored barrier with a late rank passed")
    except RuntimeError:
        pass
    if not late:
        dist.barrier(group=gloo)
    dist.barrier(group=gloo)
    try:
        weft.monitored_barrier(group, timeout=timedelta(seconds=10))
    except RuntimeError as exc:
        problems.append(f"the monitored barrier after one that failed: {exc}")
    dist.barrier(group=gloo)
    dist.destroy_process_group(group)
    return problems, elapsed


def case_monitored_barrier_missing_ranks(ctx, wait_all_ranks):
    """The last rank (and rank 1 too with wait_all_ranks, from 3 ranks up) skips a monitored
    barrier on fresh weft and gloo groups: rank 0 names them as gloo does, every rank that
    came raises, after the barrier's timeout."""
    import weft

    groups(ctx)
    skipping = {ctx.size - 1} | ({1} if wait_all_ranks and ctx.size > 2 else set())
    outcomes = {}
    for backend, barrier in (("weft", weft.monitored_barrier), ("gloo", dist.monitored_barrier)):
        group = dist.new_group(backend=backend)
        if ctx.rank not in skipping:
            start = time.monotonic()
            try:
                barrier(group, timeout=timedelta(seconds=1), wait_all_ranks=wait_all_ranks)
                outcomes[backend] = ("returned", "", 0.0)
            except RuntimeError as exc:
                message = str(exc).split("\n")[0] if ctx.rank == 0 else ""
                outcomes[backend] = ("raised", message, time.monotonic() - start)
        dist.barrier(group=groups(ctx).gloo)
        dist.destroy_process_group(group)
    return outcomes


def case_ddp(ctx):
    """DDP constructs and trains over weft; parameters agree across ranks and with gloo."""
    t = Twins(ctx)

    def train(group):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
        ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=group)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        for step in range(3):
            gen = torch.Generator().manual_seed(step * 100 + ctx.rank)
            x, y = torch.randn(4, 6, generator=gen), torch.randn(4, 1, generator=gen)
            opt.zero_grad()
            ((ddp(x) - y) ** 2).mean().backward()
            opt.step()
        params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        everyone = [torch.zeros_like(params) for _ in range(ctx.size)]
        dist.all_gather(everyone, params, group=group)
        return everyone

    t.same("DDP training", tuple, train, approx=True)
    return t.lines


def dropped_inputs(group):
    """An async reduce_scatter whose input list nothing else holds: the backend keeps the
    inputs alive until the operation is done (torch does not), and memory allocated meanwhile
    does not land on them."""
    n = dist.get_world_size(group)
    busy = [dist.all_reduce(torch.ones(1 << 21), group=group, async_op=True) for _ in range(2)]
    out = torch.zeros(1 << 18)
    work = dist.reduce_scatter(
        out, list(torch.full((n << 18,), 7.0).chunk(n)), group=group, async_op=True
    )
    scribble = torch.full((n << 18,), -1.0)
    for w in [*busy, work]:
        w.wait()
    del scribble
    return out


def collective_in_callback(group):
    """A future callback that issues collectives of its own, blocking and waited on (as DDP
    comm hooks such as PowerSGD do): they run, in the same order on every rank."""
    x, y = torch.ones(5), torch.full((5,), 2.0)

    def then(fut):
        dist.all_reduce(y, group=group)
        dist.all_reduce(y, group=group, async_op=True).wait()
        return fut.value()[0]

    fut = dist.all_reduce(x, group=group, async_op=True).get_future().then(then)
    return torch.cat([fut.wait(), y])


def send_in_callback(group):
    """Point-to-point posted from a completion callback: a relay round the ring from rank 0,
    every other rank forwarding what it got, plus one, from its receive's callback. Returns
    what this rank received: the rank's number, n on rank 0."""
    rank, n = dist.get_rank(group), dist.get_world_size(group)
    to = dist.get_global_rank(group, (rank + 1) % n)
    frm = dist.get_global_rank(group, (rank - 1) % n)
    got = torch.zeros(3)
    sends = []

    def forward(fut):
        sends.append(dist.isend(got + 1, to, group=group))
        return fut.value()

    received = dist.irecv(got, frm, group=group)
    if rank == 0:
        sends.append(dist.isend(torch.ones(3), to, group=group))
    else:
        received.get_future().then(forward)
    received.wait()
    deadline = time.monotonic() + 30
    while not sends:  # the callback may still be running
        assert time.monotonic() < deadline, "the receive's callback never ran"
        time.sleep(0.001)
    sends[0].wait()
    return got


def case_lifetimes_and_callbacks(ctx):
    t = Twins(ctx)
    t.same("async inputs dropped before wait", tuple, dropped_inputs)
    t.same("collectives issued from a future callback", tuple, collective_in_callback)
    got = send_in_callback(t.groups.weft)
    expected = ctx.size if ctx.rank == 0 else ctx.rank
    t.check("isend issued from an irecv's callback", bool((got == expected).all()), f"{got}")
    return t.lines


# ---- sparse allreduce ------------------------------------------------------------------------


def sparse_tensor(rank: int, nnz: int, dense_dims: int, dtype) -> torch.Tensor:
    """A 7x5 COO tensor (with ``dense_dims`` trailing dense dimensions of 2) holding ``nnz``
    entries at random places, repeats included, so that ranks overlap and it is uncoalesced."""
    gen = torch.Generator().manual_seed(seed_of(rank, nnz, dense_dims))
    shape = (7, 5)
    indices = torch.stack([torch.randint(0, n, (nnz,), generator=gen) for n in shape])
    entries = values((nnz,) + (2,) * dense_dims, dtype, seed_of(rank, nnz, dense_dims, dtype))
    return torch.sparse_coo_tensor(indices, entries, shape + (2,) * dense_dims)


def sparse_all_reduce(group, t, op=dist.ReduceOp.SUM, async_op=False):
    wait(dist.all_reduce(t, op=op, group=group, async_op=async_op))
    return [t.to_dense(), t._indices(), t._values(), torch.tensor(t.is_coalesced())]


def sparse_ddp(group, rank):
    """DDP over a model with a sparse embedding: its gradients are allreduced sparse."""
    torch.manual_seed(0)
    embed = torch.nn.Embedding(12, 4, sparse=True)
    model = torch.nn.Sequential(embed, torch.nn.Flatten(), torch.nn.Linear(12, 1))
    ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=group)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(3):
        gen = torch.Generator().manual_seed(step * 100 + rank)
        words, y = torch.randint(0, 12, (5, 3), generator=gen), torch.randn(5, 1, generator=gen)
        opt.zero_grad()
        ((ddp(words) - y) ** 2).mean().backward()
        opt.step()
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    everyone = [torch.zeros_like(params) for _ in range(dist.get_world_size(group))]
    dist.all_gather(everyone, params, group=group)
    return everyone


def case_sparse(ctx):
    """allreduce of sparse COO tensors as gloo does it: SUM into the coalesced input."""
    t = Twins(ctx)
    r = ctx.rank
    for dtype in (torch.float32, torch.float64, torch.int64):
        for dense_dims in (0, 1):
            for nnz in (0, 1, 13):
                mine = (nnz + r) if nnz else 0  # every rank its own count; all empty for 0
                t.same(
                    f"sparse all_reduce {dtype} dense_dims={dense_dims} nnz={mine}",
                    lambda d=dtype, k=dense_dims, n=mine: (sparse_tensor(r, n, k, d),),
                    partial(sparse_all_reduce, async_op=nnz == 13),
                )
    t.same(
        "sparse all_reduce MAX refused",
        lambda: (sparse_tensor(r, 3, 0, torch.float32),),
        partial(sparse_all_reduce, op=dist.ReduceOp.MAX),
    )
    t.same(
        "sparse all_reduce of different sizes refused",
        lambda: (torch.sparse_coo_tensor(torch.zeros(2, 1, dtype=torch.long), [1.0], (4 + r, 5)),),
        sparse_all_reduce,
    )
    t.same("DDP with a sparse embedding", tuple, partial(sparse_ddp, rank=r), approx=True)
    return t.lines


# ---- tests ----------------------------------------------------------------------------------

CASES = {
    "all_reduce": case_all_reduce,
    "reduce": case_reduce,
    "reduce_scatter": case_reduce_scatter,
    "broadcast": case_broadcast,
    "all_gather": case_all_gather,
    "all_to_all": case_all_to_all,
    "gather_scatter": case_gather_scatter,
    "p2p": case_p2p,
    "objects_and_barriers": case_objects_and_barriers,
    "subgroups": case_subgroups,
    "ddp": case_ddp,
    "lifetimes_and_callbacks": case_lifetimes_and_callbacks,
    "sparse": case_sparse,
}


@pytest.mark.parametrize("case", list(CASES))
@world_params
def test_against_gloo(pools, size, transport, case):
    assert_same(pools.get(size, transport).run(CASES[case]))


@pytest.mark.parametrize("wait_all_ranks", [False, True])
@world_params
def test_monitored_barrier_missing_ranks(pools, size, transport, wait_all_ranks):
    per_rank = pools.get(size, transport).run(case_monitored_barrier_missing_ranks, wait_all_ranks)
    for rank, outcomes in enumerate(per_rank):
        if not outcomes:
            continue  # a rank that skipped
        weft_kind, weft_message, weft_elapsed = outcomes["weft"]
        assert weft_kind == "raised", (rank, outcomes)
        assert weft_message == outcomes["gloo"][1], (rank, outcomes)
        assert 0.9 <= weft_elapsed <= 4, (rank, outcomes)


@world_params
def test_p2p_timeouts(pools, size, transport):
    per_rank = pools.get(size, transport).run(case_p2p_timeouts)
    assert [problems for problems, _ in per_rank] == [[]] * size, per_rank
    elapsed = per_rank[0][1]
    assert TIMEOUT_S * 0.9 <= elapsed <= TIMEOUT_S + 3, per_rank


@world_params
def test_abort(pools, size, transport):
    per_rank = pools.get(size, transport).run(case_abort)
    assert [problems for problems, _ in per_rank] == [[]] * size, per_rank
    assert per_rank[0][1] < 5, per_rank


@pytest.mark.parametrize("set_later", [False, True], ids=["at-creation", "set-later"])
@world_params
def test_timeout(pools, size, transport, set_later):
    outcome = pools.get(size, transport).run(case_timeout, set_later)[0]
    kind, elapsed, message = outcome
    assert kind == "DistBackendError", outcome
    assert "allreduce" in message and "rank" in message, message
    assert TIMEOUT_S * 0.9 <= elapsed <= TIMEOUT_S + 3, outcome
