"""Run by test_torchrun_restart.py under torchrun --max-restarts: a small training loop on a
weft process group that checkpoints after every step and resumes from the checkpoint when
torchrun restarts it. w -= lr * (average over ranks of a gradient drawn from (rank, step)).
argv: DIR STEPS. Rank 0 writes DIR/checkpoint.pt after each step, DIR/final.pt at the end;
every rank writes DIR/rank<r>.pid once it has taken a few steps."""

import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import weft  # noqa: F401 - registers the backend

LR = 0.1


def gradient(rank: int, step: int) -> torch.Tensor:
    return torch.randn(64, generator=torch.Generator().manual_seed(1000 * step + rank)).double()


def main():
    out, steps = Path(sys.argv[1]), int(sys.argv[2])
    dist.init_process_group("weft", timeout=timedelta(seconds=10))
    rank, size = dist.get_rank(), dist.get_world_size()
    ckpt = out / "checkpoint.pt"
    state = torch.load(ckpt) if ckpt.exists() else {"step": 0, "w": torch.zeros(64).double()}
    w, first = state["w"], state["step"]
    for step in range(first, steps):
        g = gradient(rank, step)
        dist.all_reduce(g)
        w -= LR * g / size
        if rank == 0:
            torch.save({"step": step + 1, "w": w}, out / "checkpoint.tmp")
            os.replace(out / "checkpoint.tmp", ckpt)
        if step == first + 5:
            (out / f"rank{rank}.pid").write_text(str(os.getpid()))
        time.sleep(0.01)
    if rank == 0:
        torch.save({"w": w, "resumed_from": first}, out / "final.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
