"""CUDA tensors through torch.distributed over weft's cuda_ipc transport
(csrc/core/device/cuda_ipc/), world sizes 1 to 4 all on GPU 0: several ranks per GPU, which
NCCL refuses.

The data-path cases of test_backend.py (every dtype and op; counts 0, 1, 7, the primes 1031 and
65537) run on CUDA copies of the inputs against gloo on the CPU, in pools that force cuda_ipc
(WEFT_CUDA_PATH=ipc) with 4 KiB staging buffers, so that most counts take several rounds and
the allreduces of 256 KiB and more run two-shot; then test_gpu_backend.py's stream semantics
and DDP training over cuda_ipc; then, with the default staging (64 MiB per rank), operations
of more than one round against closed-form results, and test_torch_parallel.py's functional
collectives and FSDP2 training. Marked ``gpu``: skipped without a CUDA
device or without weft's CUDA build.
"""

from __future__ import annotations

import pytest
import test_torch_parallel
import torch
import torch.distributed as dist
import weft.cuda
from test_gpu_backend import case_ddp_on_cuda, case_on_cuda, case_stream_semantics
from weft_torch import assert_same, groups

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="no CUDA device: torch.cuda.is_available() is False"
    ),
    pytest.mark.skipif(not weft.cuda.is_built(), reason="weft was built without CUDA"),
]

SMALL = [pytest.param(n, "cuda-ipc-small", id=f"ws{n}") for n in (1, 2, 3, 4)]
DEFAULT = [pytest.param(n, "cuda-ipc", id=f"ws{n}") for n in (2, 4)]
# The operations cuda_ipc serves (the others keep the staging path).
CASES = ("all_reduce", "reduce", "reduce_scatter", "broadcast", "all_gather")
# float32 elements in two default rounds and a bit: three rounds of 64 MiB per rank.
LARGE = 2 * (64 << 20) // 4 + 3


def ramp(count: int, rank: int) -> torch.Tensor:
    """Rank ``rank``'s input: (i % 5) + rank, exact in float32 for every sum of four ranks."""
    return (torch.arange(count, device="cuda") % 5 + rank).float()


def case_larger_than_staging(ctx):
    torch.cuda.set_device(0)
    group = groups(ctx).weft
    n, rank = ctx.size, ctx.rank
    ranks_sum = n * (n - 1) // 2
    lines = []

    def expect(what, got, want):
        if not torch.equal(got, want):
            wrong = (got != want).nonzero()[:4].flatten().tolist()
            lines.append(f"rank {rank}: {what}: wrong at {wrong}")

    t = ramp(LARGE, rank)
    dist.all_reduce(t, group=group)
    expect("all_reduce", t, ramp(LARGE, 0) * n + ranks_sum)

    t = ramp(LARGE, rank)
    dist.reduce(t, dst=n - 1, group=group)
    if rank == n - 1:
        expect("reduce", t, ramp(LARGE, 0) * n + ranks_sum)

    t = ramp(LARGE, rank)
    dist.broadcast(t, src=n - 1, group=group)
    expect("broadcast", t, ramp(LARGE, n - 1))

    per_rank = LARGE // n
    out = torch.empty(per_rank * n, device="cuda")
    dist.all_gather_into_tensor(out, ramp(per_rank, rank), group=group)
    expect("all_gather_into_tensor", out, torch.cat([ramp(per_rank, r) for r in range(n)]))

    out = torch.empty(per_rank, device="cuda")
    full = ramp(per_rank * n, rank)
    dist.reduce_scatter_tensor(out, full, group=group)
    block = ramp(per_rank * n, 0)[rank * per_rank : (rank + 1) * per_rank]
    expect("reduce_scatter_tensor", out, block * n + ranks_sum)
    return lines


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize(("size", "transport"), SMALL)
def test_cuda_ipc_against_gloo(pools, size, transport, case):
    assert_same(pools.get(size, transport).run(case_on_cuda, case))


@pytest.mark.parametrize(("size", "transport"), SMALL)
def test_stream_semantics(pools, size, transport):
    assert_same(pools.get(size, transport).run(case_stream_semantics))


@pytest.mark.parametrize(("size", "transport"), SMALL)
def test_ddp_on_cuda(pools, size, transport):
    pools.get(size, transport).run(case_ddp_on_cuda, {})


@pytest.mark.parametrize(("size", "transport"), DEFAULT)
def test_larger_than_staging(pools, size, transport):
    assert_same(pools.get(size, transport).run(case_larger_than_staging))


@pytest.mark.parametrize("case", list(test_torch_parallel.CASES))
@pytest.mark.parametrize(("size", "transport"), DEFAULT)
def test_torch_parallel_on_cuda(pools, size, transport, case):
    if case == "fsdp":
        test_torch_parallel.require_fully_shard()
    assert_same(pools.get(size, transport).run(case_on_cuda, case, "test_torch_parallel"))
