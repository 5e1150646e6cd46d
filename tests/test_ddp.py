"""weft.DistributedDataParallel, its compression hook and the Horovod-style broadcast helpers,
on real processes over each backend; plus examples/train_digits.py, run as torchrun would.

The DDP cases compare every step's gradients with a single-process reference that sees the
whole global batch, and check that every rank holds the same gradients.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import weft
import weft.local
from weft_torch import groups

BACKENDS = ["gloo", "weft"]
ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "train_digits.py"

# ---- cases, run on every rank of a 2-rank pool -----------------------------------------------


def group_for(ctx, backend: str) -> dist.ProcessGroup:
    """The pool's weft group or its gloo twin (weft_torch.groups: every module's cases share
    them, since a process holds one default group)."""
    torch.set_num_threads(1)
    group = getattr(groups(ctx), backend)
    assert dist.get_backend(group) == backend
    return group


class Net(torch.nn.Module):
    def __init__(self, with_unused: bool = False):
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8)
        )
        # A branch forward() never uses: DDP needs find_unused_parameters=True for it.
        self.unused = torch.nn.Linear(16, 8) if with_unused else None

    def forward(self, x):
        return self.body(x)


def global_batch(step: int, micro: int, size: int, per_rank: int = 4):
    """The same (inputs, targets) on every rank; rank r trains on rows [r*per_rank, ...)."""
    gen = torch.Generator().manual_seed(1000 * step + micro)
    rows = size * per_rank
    return torch.randn(rows, 16, generator=gen), torch.randn(rows, 8, generator=gen)


def flat_grads(module: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1) for p in module.parameters() if p.grad is not None])


def case_ddp_matches_reference(ctx, backend, options, accumulate=1, steps=3):
    group = group_for(ctx, backend)
    torch.manual_seed(0)
    with_unused = options.get("find_unused_parameters", False)
    model = weft.DistributedDataParallel(Net(with_unused), process_group=group, **options)
    reference = copy.deepcopy(model.module)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    compression = weft.ddp.COMPRESSION_DTYPES.get(options.get("compression"))
    for step in range(steps):
        reference.load_state_dict(model.module.state_dict())
        optimizer.zero_grad()
        reference.zero_grad()
        for micro in range(accumulate):
            x, y = global_batch(step, micro, ctx.size)
            torch.nn.functional.mse_loss(reference(x), y).backward()
            mine = slice(4 * ctx.rank, 4 * (ctx.rank + 1))
            last = micro == accumulate - 1
            with contextlib.nullcontext() if last else model.no_sync():
                torch.nn.functional.mse_loss(model(x[mine]), y[mine]).backward()
        got, want = flat_grads(model.module), flat_grads(reference)
        scale = want.abs().max().item()
        if compression is None:
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6 * scale)
        else:
            # The averaged gradients went over the wire in the compressed dtype.
            assert torch.equal(got.to(compression).float(), got), f"step {step}: not compressed"
            tolerance = 8e-3 if compression == torch.bfloat16 else 1e-3
            torch.testing.assert_close(got, want, rtol=tolerance, atol=tolerance * scale)
        everyone = [torch.empty_like(got) for _ in range(ctx.size)]
        dist.all_gather(everyone, got, group=group)
        assert all(torch.equal(g, got) for g in everyone), f"step {step}: ranks differ"
        optimizer.step()


def case_state_dict_like_torch(ctx, backend):
    group = group_for(ctx, backend)
    torch.manual_seed(0)
    ours = weft.DistributedDataParallel(Net(), process_group=group)
    theirs = torch.nn.parallel.DistributedDataParallel(Net(), process_group=group)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    ours.load_state_dict(theirs.state_dict())
    for name, tensor in theirs.state_dict().items():
        assert torch.equal(ours.state_dict()[name], tensor), name


def model_with_buffers(seed: int) -> torch.nn.Module:
    """Float parameters and buffers plus an int64 buffer (BatchNorm's batch counter)."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(5, 6), torch.nn.BatchNorm1d(6))
    model(torch.randn(4, 5) * (seed + 1))  # moves the running statistics
    return model


def case_broadcast_parameters(ctx, backend, root, form):
    group = group_for(ctx, backend)
    model = model_with_buffers(seed=ctx.rank)
    params = {"module": model, "named_parameters": model.named_parameters()}[form]
    weft.broadcast_parameters(params, root=root, group=group)
    expected = model_with_buffers(seed=root)
    sent = expected.state_dict() if form == "module" else dict(expected.named_parameters())
    for name, tensor in model.state_dict().items():
        want = sent.get(name, tensor)  # named_parameters() leaves the buffers alone
        assert torch.equal(tensor, want), name


def trained_optimizer(rank: int) -> torch.optim.Optimizer:
    """Adam with a rank-specific lr after ``rank`` steps (rank 0: no state yet)."""
    model = model_with_buffers(seed=0)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01 * (rank + 1))
    for step in range(rank):
        model(torch.randn(4, 5, generator=torch.Generator().manual_seed(step))).sum().backward()
        optimizer.step()
    return optimizer


def case_broadcast_optimizer_state(ctx, backend, root):
    group = group_for(ctx, backend)
    optimizer = trained_optimizer(ctx.rank)
    weft.broadcast_optimizer_state(optimizer, root=root, group=group)
    got, want = optimizer.state_dict(), trained_optimizer(root).state_dict()
    assert got["param_groups"] == want["param_groups"]
    assert got["state"].keys() == want["state"].keys()
    for index, state in want["state"].items():
        for key, value in state.items():
            assert torch.equal(got["state"][index][key], value), (index, key)


# ---- tests ------------------------------------------------------------------------------------

DDP_OPTIONS = [
    ({}, 1),
    ({"bucket_cap_mb": 0.001}, 2),  # several buckets; the first micro-batch under no_sync
    ({"find_unused_parameters": True}, 1),
    ({"static_graph": True}, 1),
    ({"compression": "bf16"}, 1),
    ({"compression": "fp16", "bucket_cap_mb": 0.001, "gradient_as_bucket_view": True}, 2),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("options", "accumulate"),
    DDP_OPTIONS,
    ids=[",".join(f"{k}={v}" for k, v in o.items()) or "default" for o, _ in DDP_OPTIONS],
)
def test_ddp_matches_reference(pools, backend, options, accumulate):
    pools.get(2, "shm").run(case_ddp_matches_reference, backend, options, accumulate)


@pytest.mark.parametrize("backend", BACKENDS)
def test_state_dict_keys_like_torch(pools, backend):
    pools.get(2, "shm").run(case_state_dict_like_torch, backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("form", ["module", "named_parameters"])
def test_broadcast_parameters(pools, backend, form):
    for root in (0, 1):
        pools.get(2, "shm").run(case_broadcast_parameters, backend, root, form)


@pytest.mark.parametrize("backend", BACKENDS)
def test_broadcast_optimizer_state(pools, backend):
    for root in (0, 1):  # root 0 has no state yet: rank 1 must drop its own
        pools.get(2, "shm").run(case_broadcast_optimizer_state, backend, root)


def test_unknown_compression_is_refused():
    with pytest.raises(ValueError, match="compression"):
        weft.DistributedDataParallel(torch.nn.Linear(1, 1), compression="int8")


# ---- the example, launched as torchrun launches it ---------------------------------------------


def run_example(backend: str, epochs: int, size: int = 2) -> list[dict]:
    """Runs train_digits.py on ``size`` processes with torchrun's environment; each rank's
    JSON result."""
    port = weft.local.free_port()
    procs = []
    for rank in range(size):
        env = {
            **os.environ,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(size),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
        }
        argv = [sys.executable, str(EXAMPLE), "--backend", backend, "--epochs", str(epochs)]
        procs.append(
            subprocess.Popen([*argv, "--json"], env=env, stdout=subprocess.PIPE, text=True)
        )
    results = []
    try:
        for rank, proc in enumerate(procs):
            out, _ = proc.communicate(timeout=120)
            assert proc.returncode == 0, f"{backend} rank {rank} exited with {proc.returncode}"
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            proc.kill()
    return results


def test_train_digits_example_matches_gloo():
    runs = {backend: run_example(backend, epochs=10) for backend in BACKENDS}
    for backend, ranks in runs.items():
        for result in ranks:
            assert result["backend"] == backend
            assert result["parameters_identical"], f"{backend}: ranks ended apart"
            assert result["test_accuracy"] >= 0.95, f"{backend}: {result['test_accuracy']}"
    for ours, gloo in zip(runs["weft"], runs["gloo"]):
        assert len(ours["losses"]) == len(gloo["losses"])
        torch.testing.assert_close(ours["losses"], gloo["losses"], rtol=1e-5, atol=0)


# ---- bench/ddp_step.py, in its smoke-test size -------------------------------------------------


def test_ddp_step_benchmark_times_every_system_in_one_launch():
    script = ROOT / "bench" / "ddp_step.py"
    proc = subprocess.run(
        [sys.executable, str(script), "--quick"], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    systems = ["gloo", "weft", "weft-bf16", "no-comm"]
    # One launch, one turn each, in the launch's rotation.
    turns = [line.split(":")[0] for line in proc.stdout.splitlines() if line.startswith("launch")]
    assert turns == [f"launch 1 turn 1 {name}" for name in systems]
    rows = [line.split("|")[1:-1] for line in proc.stdout.splitlines() if line.startswith("| ")]
    table = {cells[0].strip(): [c.strip() for c in cells[1:]] for cells in rows[1:]}
    assert list(table) == systems
    for name, cells in table.items():
        communicates = name != "no-comm"
        assert all(float(ms) > 0 for ms in cells[: 3 if communicates else 2]), (name, cells)
        assert communicates or cells[2] == "-", cells
    assert table["gloo"][3] == "1.00"
