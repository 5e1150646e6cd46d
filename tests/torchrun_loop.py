"""Run by test_torchrun_restart.py under torchrun: a weft process group (timeout T given as
argv[2] seconds) that runs allreduces, checking each against the exact sum, until argv[3]
seconds have passed; every rank writes its pid to DIR (argv[1]) once it has run some."""

import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import weft  # noqa: F401 - registers the backend


def main():
    out, timeout_s, run_s = Path(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
    dist.init_process_group("weft", timeout=timedelta(seconds=timeout_s))
    rank, size = dist.get_rank(), dist.get_world_size()
    start = time.monotonic()
    step = 0
    while time.monotonic() - start < run_s:
        t = torch.full((1000,), float(rank + step))
        dist.all_reduce(t)
        assert t[0].item() == size * step + size * (size - 1) / 2, (step, t[0].item())
        step += 1
        if step == 20:
            (out / f"rank{rank}.pid").write_text(str(os.getpid()))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
