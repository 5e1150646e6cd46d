"""A DDP training step of a ~25M-parameter model on 2 processes over weft and over gloo, one run.

    python bench/ddp_step.py            # writes bench/results/ddp_step_ws2.{json,md}
    python bench/ddp_step.py --quick    # smoke test: small model, few steps, writes nothing

Every system trains the same model (an MLP 1024-4096-4096-1024, 25.2M float32 parameters) with
weft.DistributedDataParallel (torch's DDP: default 25 MB buckets, reduced while backward runs)
and SGD, on the same fixed batch. Systems: gloo, weft, weft with bf16 gradient compression, and
no-comm: DDP with a comm hook that leaves each bucket as it is, the floor any backend's step
could reach (DDP's own bucket copies, no communication, no waiting for the other rank).

Method. Each rank runs one torch thread (2 ranks on this 2-core machine). In each launch every
system has its own model on its own process group (weft's is the default group, gloo's a
subgroup), and the systems take turns, `--turns` times in an order that rotates, so that all
meet the same placement of ranks on CPUs, which changes from launch to launch, and the same
background load. Per turn, three figures, each the mean over `--steps` iterations and the max
over ranks: the full step (forward, backward with its gradient allreduce, optimizer step); the
same step under no_sync (compute only, no communication); and one allreduce of a flat tensor as
large as all the gradients (communication only). Each figure is the median over all turns of
`--repeats` launches. Every system's tensors are on transparent huge pages
(THP_MEM_ALLOC_ENABLE=1, which the ranks inherit) unless `--default-pages`; the table says which.
"""

from __future__ import annotations

import argparse
import datetime
import gc
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
SYSTEMS = {
    "gloo": ("gloo", None),
    "weft": ("weft", None),
    "weft-bf16": ("weft", "bf16"),
    "no-comm": ("weft", None),
}


def keep_bucket_hook(_, bucket):
    """A comm hook that communicates nothing: the bucket stays this rank's own. (No annotations:
    DDP checks them, and this file's are strings.)"""
    future = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future


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


class System:
    """One system's DDP model, optimizer and gradients-sized tensor, on its process group."""

    def __init__(self, name: str, group, opts: dict):
        _, compression = SYSTEMS[name]
        torch.manual_seed(0)
        self.group = group
        self.communicates = name != "no-comm"
        self.model = weft.DistributedDataParallel(
            make_model(opts["width"]), process_group=group, compression=compression
        )
        if not self.communicates:
            self.model.register_comm_hook(None, keep_bucket_hook)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=1e-4)
        self.grads = torch.zeros(sum(p.numel() for p in self.model.parameters()))

    def step(self, x, y) -> None:
        self.optimizer.zero_grad()
        torch.nn.functional.mse_loss(self.model(x), y).backward()
        self.optimizer.step()

    def allreduce_all_gradients(self) -> None:
        dist.all_reduce(self.grads, group=self.group)

    def measure(self, x, y, steps: int) -> dict:
        def compute_only():
            with self.model.no_sync():
                self.step(x, y)

        figures = {
            "step_s": mean_seconds(lambda: self.step(x, y), steps),
            "compute_s": mean_seconds(compute_only, steps),
            "parameters": self.grads.numel(),
        }
        if self.communicates:
            figures["allreduce_s"] = mean_seconds(self.allreduce_all_gradients, steps)
        return figures


def time_rank(rank: int, size: int, store, opts: dict, launch: int) -> dict:
    """One launch: every system on its own process group, taking turns (the order rotating)
    so that each meets the same placement of ranks on CPUs and the same background load."""
    torch.set_num_threads(1)
    dist.init_process_group("weft", store=store, rank=rank, world_size=size)
    groups = {"weft": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
    names = opts["systems"]
    systems = {name: System(name, groups[SYSTEMS[name][0]], opts) for name in names}
    x = torch.randn(opts["batch"], opts["width"] // 4)
    y = torch.randn(opts["batch"], opts["width"] // 4)
    for system in systems.values():
        for _ in range(opts["warmup"]):
            system.step(x, y)
    turns: dict[str, list[dict]] = {name: [] for name in names}
    for turn in range(opts["turns"]):
        shift = (launch + turn) % len(names)
        for name in names[shift:] + names[:shift]:
            turns[name].append(systems[name].measure(x, y, opts["steps"]))
    dist.barrier()
    del systems  # DDP's reducers hold the groups; let them go while Python is whole
    gc.collect()
    dist.destroy_process_group()
    return turns


def run(opts: dict) -> dict:
    names = opts["systems"]
    rounds: dict[str, list[dict]] = {name: [] for name in names}
    for launch in range(opts["repeats"]):
        per_rank = weft.local.spawn(time_rank, WORLD_SIZE, opts, launch)
        for name in names:
            for turn, at_ranks in enumerate(zip(*(r[name] for r in per_rank))):
                figures = {key: max(r[key] for r in at_ranks) for key in at_ranks[0]}
                rounds[name].append(figures)
                print(f"launch {launch + 1} turn {turn + 1} {name}: " + describe(figures))
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
        f"median of {opts['turns']} turns in each of {opts['repeats']} launches (each the mean of "
        f"{opts['steps']} steps, max over ranks; the systems take turns within a launch). "
        f"Load average before the run: {report['load_average_before']:.2f} on "
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
            + (f"{m['allreduce_s'] * 1e3:.1f} | " if "allreduce_s" in m else "- | ")
            + (f"{m['step_s'] / gloo_step:.2f} |" if gloo_step else "- |")
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--width", type=int, default=4096, help="hidden width (25.2M at 4096)")
    parser.add_argument("--batch", type=int, default=32, help="samples per rank")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3, help="launches")
    parser.add_argument("--turns", type=int, default=3, help="turns of every system per launch")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated")
    parser.add_argument("--quick", action="store_true", help="width 512, 3 steps, 1 launch, 1 turn")
    parser.add_argument(
        "--default-pages", action="store_true", help="leave torch's tensors on 4 KiB pages"
    )
    args = parser.parse_args()
    if not args.default_pages:
        os.environ["THP_MEM_ALLOC_ENABLE"] = "1"
    if args.quick:
        args.width, args.steps, args.warmup, args.repeats, args.turns = 512, 3, 1, 1, 1
    opts = {k: getattr(args, k) for k in ("width", "batch", "steps", "warmup", "repeats", "turns")}
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
