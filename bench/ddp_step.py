"""A DDP training step of a ~25M-parameter model on 2 processes over weft and over gloo, one run.

    python bench/ddp_step.py            # writes bench/results/ddp_step_ws2.{json,md}
    python bench/ddp_step.py --quick    # smoke test: small model, few steps, writes nothing

Every system trains the same model (an MLP 1024-4096-4096-1024, 25.2M float32 parameters) with
weft.DistributedDataParallel (torch's DDP: default 25 MB buckets, reduced while backward runs)
and SGD, on the same fixed batch. Systems: gloo, weft, and weft with bf16 gradient compression.

Method. Each rank runs one torch thread (2 ranks on this 2-core machine). Per launch, after
`--warmup` steps and a barrier, three figures, each the mean over `--steps` iterations and the
max over ranks: the full step (forward, backward with its gradient allreduce, optimizer step);
the same step under no_sync (compute only, no communication); and one allreduce of a flat
tensor as large as all the gradients (communication only). Systems are launched in turn,
`--repeats` rounds with the order rotated each round; each figure is the median over rounds.
Every system's tensors are on transparent huge pages (THP_MEM_ALLOC_ENABLE=1, which the ranks
inherit) unless `--default-pages`; the table says which.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist
import weft
import weft.local

RESULTS = Path(__file__).resolve().parent / "results"
WORLD_SIZE = 2
# name -> (process group backend, weft.DistributedDataParallel compression)
SYSTEMS = {"gloo": ("gloo", None), "weft": ("weft", None), "weft-bf16": ("weft", "bf16")}


def make_model(width: int) -> torch.nn.Module:
    edge = width // 4
    return torch.nn.Sequential(
        torch.nn.Linear(edge, width),
        torch.nn.ReLU(),
        torch.nn.Linear(width, width),
        torch.nn.ReLU(),
        torch.nn.Linear(width, edge),
    )


def mean_seconds(fn, iterations: int) -> float:
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iterations):
        fn()
    return (time.perf_counter() - start) / iterations


def time_rank(rank: int, size: int, store, system: str, opts: dict) -> dict:
    backend, compression = SYSTEMS[system]
    torch.set_num_threads(1)
    dist.init_process_group(backend, store=store, rank=rank, world_size=size)
    torch.manual_seed(0)
    model = weft.DistributedDataParallel(make_model(opts["width"]), compression=compression)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(opts["batch"], opts["width"] // 4)
    y = torch.randn(opts["batch"], opts["width"] // 4)

    def step():
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()

    def compute_only():
        with model.no_sync():
            step()

    grads = torch.zeros(sum(p.numel() for p in model.parameters()))
    for _ in range(opts["warmup"]):
        step()
    result = {
        "step_s": mean_seconds(step, opts["steps"]),
        "compute_s": mean_seconds(compute_only, opts["steps"]),
        "allreduce_s": mean_seconds(lambda: dist.all_reduce(grads), opts["steps"]),
        "parameters": grads.numel(),
    }
    dist.barrier()
    dist.destroy_process_group()
    return result


def run(opts: dict) -> dict:
    names = opts["systems"]
    rounds: dict[str, list[dict]] = {name: [] for name in names}
    for round_index in range(opts["repeats"]):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            per_rank = weft.local.spawn(time_rank, WORLD_SIZE, name, opts)
            figures = {key: max(r[key] for r in per_rank) for key in per_rank[0]}
            rounds[name].append(figures)
            print(f"round {round_index + 1} {name}: " + describe(figures), flush=True)
    medians = {
        name: {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        for name, runs in rounds.items()
    }
    return {"rounds": rounds, "median": medians}


def describe(figures: dict) -> str:
    return ", ".join(
        f"{key[:-2]} {figures[key] * 1e3:.1f} ms" for key in figures if key != "parameters"
    )


def markdown(report: dict) -> str:
    medians = report["median"]
    gloo_step = medians.get("gloo", {}).get("step_s")
    parameters = next(iter(medians.values()))["parameters"]
    opts = report["options"]
    lines = [
        f"DDP training step, world size 2, MLP of {parameters / 1e6:.1f}M "
        f"float32 parameters, batch {opts['batch']} per rank, {report['date']}. Milliseconds, "
        f"median of {opts['repeats']} launches (each the mean of {opts['steps']} steps, max over "
        f"ranks). Load average before the run: {report['load_average_before']:.2f} on "
        f"{os.cpu_count()} cores. Tensors on "
        + (
            "transparent huge pages (THP_MEM_ALLOC_ENABLE=1)."
            if opts.get("huge_pages")
            else "torch's default 4 KiB pages."
        ),
        "",
        "| system | step | compute only (no_sync) | allreduce of all gradients | step / gloo's |",
        "|---|---|---|---|---|",
    ]
    for name, m in medians.items():
        lines.append(
            f"| {name} | {m['step_s'] * 1e3:.1f} | {m['compute_s'] * 1e3:.1f} | "
            f"{m['allreduce_s'] * 1e3:.1f} | "
            + (f"{m['step_s'] / gloo_step:.2f} |" if gloo_step else "- |")
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--width", type=int, default=4096, help="hidden width (25.2M at 4096)")
    parser.add_argument("--batch", type=int, default=32, help="samples per rank")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated")
    parser.add_argument("--quick", action="store_true", help="width 512, 3 steps, 1 round")
    parser.add_argument(
        "--default-pages", action="store_true", help="leave torch's tensors on 4 KiB pages"
    )
    args = parser.parse_args()
    if not args.default_pages:
        os.environ["THP_MEM_ALLOC_ENABLE"] = "1"
    if args.quick:
        args.width, args.steps, args.warmup, args.repeats = 512, 3, 1, 1
    opts = {k: getattr(args, k) for k in ("width", "batch", "steps", "warmup", "repeats")}
    opts["systems"] = args.systems.split(",")
    opts["huge_pages"] = not args.default_pages
    load_before = os.getloadavg()[0]
    report = {
        "date": datetime.date.today().isoformat(),
        "options": opts,
        "load_average_before": load_before,
        "torch": torch.__version__,
        **run(opts),
    }
    table = markdown(report)
    print(table)
    if not args.quick:
        RESULTS.mkdir(exist_ok=True)
        stem = "ddp_step_ws2" + ("_default_pages" if args.default_pages else "")
        (RESULTS / f"{stem}.json").write_text(json.dumps(report, indent=1) + "\n")
        (RESULTS / f"{stem}.md").write_text(table)


if __name__ == "__main__":
    main()
