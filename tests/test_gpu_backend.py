"""CUDA tensors through torch.distributed over weft, staged through pinned host memory
(WEFT_CUDA_PATH=staging, see csrc/torch/cuda_staging.h), on real processes that all share GPU 0.
test_gpu_ipc.py runs the same cases over cuda_ipc.

Every case of test_backend.py runs again with the weft side on CUDA copies of the inputs,
against gloo on the CPU; then the stream semantics (an operation waits for the caller's stream,
``Work.wait()`` and the future make the caller's stream wait for the result) and DDP on CUDA
with ``weft.DistributedDataParallel``. Marked ``gpu``: skipped without a CUDA device.
"""

from __future__ import annotations

import copy
import importlib

import pytest
import test_backend
import torch
import torch.distributed as dist
from test_ddp import Net, flat_grads, global_batch
from weft_torch import assert_same, groups, weft_on

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="no CUDA device: torch.cuda.is_available() is False"
    ),
]

WORLDS = [pytest.param(n, "cuda-staging", id=f"ws{n}") for n in (2, 3, 4)]
# DDP trains on tensors the case creates itself: its CUDA form is case_ddp_on_cuda. Sparse
# CUDA tensors are refused (docs/backend.md).
CASES = [name for name in test_backend.CASES if name not in ("ddp", "sparse")]


def case_on_cuda(ctx, name, cases_module="test_backend"):
    """The case ``name`` of ``cases_module``'s CASES, with the weft side on GPU 0."""
    torch.cuda.set_device(0)
    with weft_on("cuda"):
        return importlib.import_module(cases_module).CASES[name](ctx)


def case_stream_semantics(ctx, own_gpu=False):
    """own_gpu: rank r on GPU r (NCCL's rule), else every rank on GPU 0."""
    torch.cuda.set_device(ctx.rank if own_gpu else 0)
    group = groups(ctx).weft
    n = 1 << 20
    expected = float(n * sum(r + 1 for r in range(ctx.size)))
    lines = []
    side = torch.cuda.Stream()
    t = torch.zeros(n, device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # the fill below is still queued when all_reduce starts
        t.fill_(ctx.rank + 1)
        work = dist.all_reduce(t, group=group, async_op=True)
        work.wait()  # from here on, `side` runs after the copy back
        total = t.sum()
        mine = torch.full((n,), float(ctx.rank + 1), device="cuda")
        future = dist.all_reduce(mine, group=group, async_op=True).get_future()
        through_future = future.wait()[0].sum()
        blocking = torch.full((n,), float(ctx.rank + 1), device="cuda")
        dist.all_reduce(blocking, group=group)
        after_blocking = blocking.sum()
    side.synchronize()
    for what, got in (
        ("Work.wait()", total),
        ("get_future().wait()", through_future),
        ("async_op=False", after_blocking),
    ):
        if got.item() != expected:
            lines.append(f"rank {ctx.rank}: {what}: sum {got.item()}, expected {expected}")
    return lines


def case_ddp_on_cuda(ctx, options, own_gpu=False):
    """weft.DistributedDataParallel on a CUDA model: each step's gradients match a reference
    that sees the whole global batch (as test_ddp.py does on the CPU). own_gpu: rank r on GPU r,
    else every rank on GPU 0."""
    device = ctx.rank if own_gpu else 0
    torch.cuda.set_device(device)
    group = groups(ctx).weft
    torch.manual_seed(0)
    model = weft_ddp(Net().cuda(), group, options, device)
    reference = copy.deepcopy(model.module)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    tolerance = 8e-3 if options.get("compression") else 1e-4
    for step in range(3):
        reference.load_state_dict(model.module.state_dict())
        optimizer.zero_grad()
        reference.zero_grad()
        x, y = (t.cuda() for t in global_batch(step, 0, ctx.size))
        torch.nn.functional.mse_loss(reference(x), y).backward()
        mine = slice(4 * ctx.rank, 4 * (ctx.rank + 1))
        torch.nn.functional.mse_loss(model(x[mine]), y[mine]).backward()
        got, want = flat_grads(model.module), flat_grads(reference)
        scale = want.abs().max().item()
        torch.testing.assert_close(got, want, rtol=tolerance, atol=tolerance * scale)
        optimizer.step()
    return []


def weft_ddp(module, group, options, device=0):
    import weft

    return weft.DistributedDataParallel(module, device_ids=[device], process_group=group, **options)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize(("size", "transport"), WORLDS)
def test_cuda_tensors_against_gloo(pools, size, transport, case):
    assert_same(pools.get(size, transport).run(case_on_cuda, case))


@pytest.mark.parametrize(("size", "transport"), WORLDS)
def test_stream_semantics(pools, size, transport):
    assert_same(pools.get(size, transport).run(case_stream_semantics))


@pytest.mark.parametrize("options", [{}, {"compression": "bf16"}], ids=["default", "bf16"])
@pytest.mark.parametrize(("size", "transport"), WORLDS)
def test_ddp_on_cuda(pools, size, transport, options):
    pools.get(size, transport).run(case_ddp_on_cuda, options)
