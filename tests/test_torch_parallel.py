"""torch's parallelism built on its process groups, over weft against gloo: the functional
collectives (what torch.compile and DTensor issue) and FSDP2's ``fully_shard``.

Each case runs on every rank of the shared pools (weft_pool.py) at world sizes 2, 3 and 4, once
on the weft group and once on a gloo group over the same ranks, with the same inputs
(weft_torch.Twins); any difference in results or raised errors fails the test. World size 3
shards FSDP's parameters unevenly (padded), so its all-gathers and reduce-scatters see padding.
The weft side runs on CUDA tensors too (Twins.weft_device), as test_gpu_ipc.py asks.
"""

from __future__ import annotations

from functools import partial

import pytest
import torch
import torch.distributed._functional_collectives as funcol
from weft_torch import GLOO_HAS_AVG, Twins, assert_same, values

WORLDS = [pytest.param(n, "shm", id=f"ws{n}") for n in (2, 3, 4)]
DTYPES = (torch.float32, torch.bfloat16, torch.int64)
# torch 2.13 renames the *_tensor forms; older releases have only those.
all_gather_single = getattr(funcol, "all_gather_single", None) or funcol.all_gather_tensor
reduce_scatter_single = (
    getattr(funcol, "reduce_scatter_single", None) or funcol.reduce_scatter_tensor
)


def fully_shard_api():
    """``fully_shard`` (FSDP2), or None where this torch lacks it or ``DeviceMesh.from_group``."""
    from torch.distributed.device_mesh import DeviceMesh

    if not hasattr(DeviceMesh, "from_group"):
        return None
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        try:
            from torch.distributed._composable.fsdp import fully_shard
        except ImportError:
            return None
    return fully_shard


def require_fully_shard() -> None:
    """Skips the calling test where this torch lacks FSDP2."""
    if fully_shard_api() is None:
        pytest.skip(f"torch {torch.__version__} has no fully_shard or DeviceMesh.from_group")


def tensors(shape, dtype, seed) -> tuple:
    return (values(shape, dtype, seed),)


# ---- cases, run on every rank --------------------------------------------------------------


def case_functional_collectives(ctx):
    t = Twins(ctx)
    n, r = ctx.size, ctx.rank
    ops = ["sum", "max", "min"] + (["avg"] if GLOO_HAS_AVG else [])
    # Rank i sends rank j 1 + (i + j) % 2 rows: uneven splits both ways.
    splits = [1 + (r + j) % 2 for j in range(n)]
    for dtype in DTYPES:
        tall = partial(tensors, (n * 3, 5), dtype, 1000 * r)
        square = partial(tensors, (n * 3, n * 2), dtype, 2000 * r)
        for op in ops:
            if op == "avg" and not dtype.is_floating_point:
                continue
            t.same(
                f"all_reduce {op} {dtype}", tall, lambda g, x, op=op: funcol.all_reduce(x, op, g)
            )
            for dim in (0, 1):
                t.same(
                    f"reduce_scatter {op} dim {dim} {dtype}",
                    square,
                    lambda g, x, op=op, dim=dim: reduce_scatter_single(x, op, dim, g),
                )
        for dim in (0, 1):
            t.same(
                f"all_gather dim {dim} {dtype}",
                tall,
                lambda g, x, dim=dim: all_gather_single(x, dim, g),
            )
        t.same(
            f"broadcast from rank {n - 1} {dtype}",
            tall,
            lambda g, x: funcol.broadcast(x, n - 1, g),
        )
        t.same(
            f"all_to_all_single, even {dtype}",
            tall,
            lambda g, x: funcol.all_to_all_single(x, None, None, g),
        )
        t.same(
            f"all_to_all_single, uneven splits {dtype}",
            partial(tensors, (sum(splits), 3), dtype, 3000 * r),
            lambda g, x: funcol.all_to_all_single(x, splits, splits, g),
        )
    return t.lines


def case_fsdp(ctx):
    """Three SGD steps of a small MLP, each Linear and the root wrapped by ``fully_shard`` over
    the group; every rank sees its own data. Compares each step's loss and the final full
    parameters (gathered by DTensor's full_tensor)."""
    from torch.distributed.device_mesh import DeviceMesh

    fully_shard = fully_shard_api()
    t = Twins(ctx)

    def train(group, reshard_after_forward):
        device = Twins.weft_device if group is t.groups.weft else "cpu"
        mesh = DeviceMesh.from_group(group, torch.device(device).type)
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 7), torch.nn.Tanh()
        ).to(device)
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh, reshard_after_forward=reshard_after_forward)
        fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        losses = []
        for step in range(3):
            gen = torch.Generator().manual_seed(100 * step + ctx.rank)
            x, y = (torch.randn(8, k, generator=gen).to(device) for k in (16, 7))
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.detach())
        full = [p.full_tensor().detach() for p in model.parameters()]
        return (torch.stack(losses), *full)

    for reshard in (True, False):
        t.same(
            f"FSDP2 training, reshard_after_forward={reshard}",
            tuple,
            lambda g, reshard=reshard: train(g, reshard),
            approx=True,
        )
    return t.lines


# test_gpu_ipc.py runs them again with the weft side on CUDA.
CASES = {"functional_collectives": case_functional_collectives, "fsdp": case_fsdp}

# ---- tests ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("size", "transport"), WORLDS)
def test_functional_collectives(pools, size, transport):
    assert_same(pools.get(size, transport).run(case_functional_collectives))


@pytest.mark.parametrize(("size", "transport"), WORLDS)
def test_fsdp(pools, size, transport):
    require_fully_shard()
    assert_same(pools.get(size, transport).run(case_fsdp))
