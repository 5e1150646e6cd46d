"""Per-call cost of an 8-byte allreduce through torch.distributed over weft, next to gloo and
to weft's core API, on 2 local ranks in one run.

    python bench/backend_overhead.py [--iterations N] [--repeats R]

Each system runs `warmup` untimed calls, a barrier, then `iterations` timed calls, `repeats`
times; a repeat's time per call is the slowest rank's, and the median repeat is reported.
Writes bench/results/backend_overhead_ws2.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from datetime import timedelta
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def time_calls(call, barrier, iterations: int, warmup: int, repeats: int) -> list[float]:
    for _ in range(warmup):
        call()
    seconds = []
    for _ in range(repeats):
        barrier()
        start = time.perf_counter()
        for _ in range(iterations):
            call()
        seconds.append((time.perf_counter() - start) / iterations)
    return seconds


def rank_main(rank, size, store, iterations, repeats):
    import torch
    import torch.distributed as dist
    import weft

    dist.init_process_group(
        "weft",
        store=dist.PrefixStore("torch/", store),
        rank=rank,
        world_size=size,
        timeout=timedelta(seconds=60),
    )
    gloo = dist.new_group(backend="gloo")
    comm = weft.Communicator(store, rank, size, name="core", timeout=60)
    tensor = torch.zeros(2, dtype=torch.float32)  # 8 bytes
    array = tensor.numpy()

    systems = {
        "dist.all_reduce, weft": (lambda: dist.all_reduce(tensor), iterations),
        "dist.all_reduce(async_op=True).wait(), weft": (
            lambda: dist.all_reduce(tensor, async_op=True).wait(),
            iterations,
        ),
        "dist.all_reduce, gloo": (lambda: dist.all_reduce(tensor, group=gloo), iterations // 20),
        "weft.Communicator.allreduce (core API)": (lambda: comm.allreduce(array), iterations),
    }
    out = {}
    for name, (call, n) in systems.items():
        out[name] = time_calls(call, dist.barrier, n, max(n // 10, 10), repeats)
    dist.destroy_process_group()
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    import torch
    import weft.local

    per_rank = weft.local.spawn(rank_main, 2, args.iterations, args.repeats)
    rows = []
    for name in per_rank[0]:
        slowest = [max(r[name][i] for r in per_rank) for i in range(args.repeats)]
        rows.append({"system": name, "us_per_call": statistics.median(slowest) * 1e6})
    result = {
        "world_size": 2,
        "bytes": 8,
        "torch": torch.__version__,
        "iterations": args.iterations,
        "repeats": args.repeats,
        "rows": rows,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "backend_overhead_ws2.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = ["| system | µs per 8-byte allreduce |", "|---|---|"]
    lines += [f"| {row['system']} | {row['us_per_call']:.2f} |" for row in rows]
    table = "\n".join(lines)
    (RESULTS / "backend_overhead_ws2.md").write_text(
        f"World size 2, float32 x 2, torch {torch.__version__}, median of {args.repeats} "
        f"repeats.\n\n{table}\n"
    )
    print(table)


if __name__ == "__main__":
    main()
