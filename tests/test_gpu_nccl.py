"""CUDA tensors through torch.distributed over weft's nccl transport
(csrc/core/device/nccl/): NCCL's native collectives (WEFT_CUDA_PATH=nccl) and weft's Plans
over ncclSend/ncclRecv (WEFT_NCCL_MODE=plans, 4 KiB steps so that operations take several
rounds). Rank r runs on GPU r, as NCCL requires: world size 1 runs on one GPU, larger worlds
skip with "needs N GPUs" where there are fewer.

Every dtype and op of all_reduce, reduce and reduce_scatter_tensor, and broadcast and
all_gather_into_tensor, against a reference each rank computes from every rank's (seeded)
input; then the data-path cases of test_backend.py against gloo, the stream semantics and DDP.
At world size 1 weft's Plans are a local copy (the Avg division included): the p2p part of the
Plan executor needs two GPUs, and its schedules are replayed on the host by
test_group_schedule.py. With every rank on GPU 0, WEFT_CUDA_PATH=nccl must refuse with the
reason and auto must fall back to cuda_ipc. Marked ``gpu``: skipped without a CUDA device or
without weft's NCCL build.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import weft.cuda
from test_gpu_backend import case_ddp_on_cuda, case_on_cuda, case_stream_semantics
from weft_torch import REDUCE_DTYPES, assert_same, groups, weft_on

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="no CUDA device: torch.cuda.is_available() is False"
    ),
    pytest.mark.skipif(weft.cuda.nccl_version() is None, reason="weft was built without NCCL"),
]

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


def worlds(transport: str, sizes=(1, 2, 3, 4)):
    return [
        pytest.param(
            n,
            transport,
            id=f"ws{n}",
            marks=pytest.mark.skipif(GPUS < n, reason=f"needs {n} GPUs, found {GPUS}"),
        )
        for n in sizes
    ]


NATIVE = worlds("cuda-nccl")
PLANS = worlds("cuda-nccl-plans")
# weft's reduction dtypes: gloo's, but bool.
DTYPES = tuple(d for d in REDUCE_DTYPES if d is not torch.bool)
OPS = {
    "sum": dist.ReduceOp.SUM,
    "prod": dist.ReduceOp.PRODUCT,
    "min": dist.ReduceOp.MIN,
    "max": dist.ReduceOp.MAX,
    "avg": dist.ReduceOp.AVG,
}
# The operations the nccl transport serves (the others keep the staging path).
CASES = ("all_reduce", "reduce", "reduce_scatter", "broadcast", "all_gather")
COUNT = 4099  # odd: ring blocks of unequal length


def own_gpu(ctx) -> torch.device:
    torch.cuda.set_device(ctx.rank)
    return torch.device("cuda", ctx.rank)


def input_of(rank: int, count: int, dtype: torch.dtype, device) -> torch.Tensor:
    """Small integers (exact in every dtype for products and sums of four ranks)."""
    gen = torch.Generator().manual_seed(1000 * rank + count)
    low = 0 if dtype == torch.uint8 else -3
    return torch.randint(low, 4, (count,), generator=gen).to(dtype).to(device)


def reference(inputs: list[torch.Tensor], op: str) -> torch.Tensor:
    """The fold of every rank's input in rank order, in the inputs' dtype (integers wrap);
    avg divides the sum by the world size (integers truncate toward zero)."""
    acc = inputs[0].clone()
    for t in inputs[1:]:
        if op in ("sum", "avg"):
            acc = acc + t
        elif op == "prod":
            acc = acc * t
        elif op == "min":
            acc = torch.minimum(acc, t)
        else:
            acc = torch.maximum(acc, t)
    if op == "avg":
        if acc.is_floating_point():
            acc = acc / len(inputs)
        else:
            acc = torch.div(acc, len(inputs), rounding_mode="trunc")
    return acc


def compare(lines, what, got, want):
    try:
        torch.testing.assert_close(got.cpu(), want.cpu(), rtol=1e-2, atol=1e-2)
    except AssertionError as exc:
        lines.append(f"{what}: {str(exc).splitlines()[0]}")


def case_every_dtype_and_op(ctx):
    device = own_gpu(ctx)
    group = groups(ctx).weft
    n, rank = ctx.size, ctx.rank
    lines = []
    for dtype in DTYPES:
        inputs = [input_of(r, COUNT, dtype, device) for r in range(n)]
        for name, op in OPS.items():
            want = reference(inputs, name)
            what = f"rank {rank} {dtype} {name}"
            t = inputs[rank].clone()
            dist.all_reduce(t, op=op, group=group)
            compare(lines, f"{what} all_reduce", t, want)
            for root in {0, n - 1}:
                t = inputs[rank].clone()
                dist.reduce(t, dst=root, op=op, group=group)
                compare(
                    lines, f"{what} reduce to {root}", t, want if rank == root else inputs[rank]
                )
            per = COUNT // n
            full = [input_of(r, per * n, dtype, device) for r in range(n)]
            out = torch.empty(per, dtype=dtype, device=device)
            dist.reduce_scatter_tensor(out, full[rank], op=op, group=group)
            block = reference(full, name)[rank * per : (rank + 1) * per]
            compare(lines, f"{what} reduce_scatter_tensor", out, block)
        for root in {0, n - 1}:
            t = inputs[rank].clone()
            dist.broadcast(t, src=root, group=group)
            compare(lines, f"rank {rank} {dtype} broadcast from {root}", t, inputs[root])
        out = torch.empty(COUNT * n, dtype=dtype, device=device)
        dist.all_gather_into_tensor(out, inputs[rank], group=group)
        compare(lines, f"rank {rank} {dtype} all_gather_into_tensor", out, torch.cat(inputs))
        # In place: the input is this rank's block of the output.
        out = torch.cat([torch.zeros_like(inputs[0])] * n)
        mine = out[rank * COUNT : (rank + 1) * COUNT]
        mine.copy_(inputs[rank])
        dist.all_gather_into_tensor(out, mine, group=group)
        compare(
            lines, f"rank {rank} {dtype} all_gather_into_tensor in place", out, torch.cat(inputs)
        )
    torch.cuda.synchronize()
    return lines


def case_on_own_gpu(ctx, name):
    own_gpu(ctx)
    import test_backend

    with weft_on("cuda"):
        return test_backend.CASES[name](ctx)


def case_forced_nccl_on_shared_gpu(ctx):
    """Every rank on GPU 0 with WEFT_CUDA_PATH=nccl: a clear error on every rank, no hang."""
    torch.cuda.set_device(0)
    t = torch.ones(8, device="cuda")
    try:
        dist.all_reduce(t, group=groups(ctx).weft)
    except RuntimeError as exc:
        text = str(exc)
        if "nccl unavailable" in text and "share GPU" in text:
            return []
        return [f"rank {ctx.rank}: unexpected error: {text}"]
    return [f"rank {ctx.rank}: all_reduce over nccl with ranks sharing GPU 0 did not fail"]


def case_auto_on_shared_gpu(ctx):
    """auto with every rank on GPU 0: NCCL cannot serve it, cuda_ipc does."""
    torch.cuda.set_device(0)
    t = torch.full((1 << 16,), float(ctx.rank + 1), device="cuda")
    dist.all_reduce(t, group=groups(ctx).weft)
    want = float(sum(range(1, ctx.size + 1)))
    return [] if bool((t == want).all()) else [f"rank {ctx.rank}: {t[:4].tolist()} != {want}"]


@pytest.mark.parametrize(("size", "transport"), NATIVE + PLANS)
def test_every_dtype_and_op(pools, size, transport):
    assert_same(pools.get(size, transport).run(case_every_dtype_and_op))


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize(("size", "transport"), NATIVE + PLANS)
def test_against_gloo(pools, size, transport, case):
    if size == 1:
        assert_same(pools.get(size, transport).run(case_on_cuda, case))
    else:
        assert_same(pools.get(size, transport).run(case_on_own_gpu, case))


@pytest.mark.parametrize(("size", "transport"), NATIVE + PLANS)
def test_stream_semantics(pools, size, transport):
    assert_same(pools.get(size, transport).run(case_stream_semantics, own_gpu=True))


@pytest.mark.parametrize(("size", "transport"), worlds("cuda-nccl", (1, 2)))
def test_ddp_on_cuda(pools, size, transport):
    pools.get(size, transport).run(case_ddp_on_cuda, {}, own_gpu=True)


@pytest.mark.parametrize("size", [2, 3])
def test_forced_nccl_refuses_a_shared_gpu(pools, size):
    assert_same(pools.get(size, "cuda-nccl").run(case_forced_nccl_on_shared_gpu))


@pytest.mark.parametrize("size", [1, 2])
def test_auto_falls_back_to_cuda_ipc_on_a_shared_gpu(pools, size):
    assert_same(pools.get(size, "cuda-auto").run(case_auto_on_shared_gpu))
