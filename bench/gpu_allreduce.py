"""Allreduce of CUDA tensors through torch.distributed: weft over cuda_ipc with several ranks on
one GPU, next to NCCL at world size 1 (weft's nccl transport, native and Plans, and torch's nccl
backend), in one run.

    python bench/gpu_allreduce.py [-b 8K] [-e 1G] [-f 4] [-n 20] [-w 3] [--ranks 2,4]

Every rank sets GPU 0, so weft's ranks share one GPU (NCCL refuses that: its lines run one rank,
where an allreduce is a local copy, and show the per-call cost of each path: weft's nccl
transport, native (WEFT_CUDA_PATH=nccl) and with weft's Plans over ncclSend/ncclRecv
(WEFT_NCCL_MODE=plans, a local copy at one rank), against torch's own nccl backend). Sizes from
-b to -e by factor -f, plus -e itself; float32 sum, in place, like nccl-tests. Per size: a
check (every element must equal the world size), -w untimed calls, a barrier, then -n calls
timed on the host up to a cudaDeviceSynchronize; time per call = elapsed / -n, the slowest
rank's. Bandwidth as nccl-tests reports it: algbw = S / t, busbw = algbw * 2(n-1)/n (zero at
world size 1). weft's cuda_ipc calls return when the operation is done on every rank (it
synchronizes on the host between its phases); NCCL's calls, through weft or torch, are queued.

Writes bench/results/gpu_allreduce_<device>.{json,png}; needs a CUDA device, torch with CUDA
and weft built with CUDA, and says which one is missing otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import timedelta
from pathlib import Path

from gpu_reduce import RESULTS, device_slug, no_gpu_reason

UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    text = text.strip().upper()
    if text and text[-1] in UNITS:
        return int(text[:-1]) * UNITS[text[-1]]
    return int(text)


def sizes(first: int, last: int, factor: int) -> list[int]:
    out = [first]
    while out[-1] * factor <= last:
        out.append(out[-1] * factor)
    if out[-1] != last:
        out.append(last)
    return out


def rank_main(rank, size, store, backend, byte_sizes, iters, warmup):
    import torch
    import torch.distributed as dist
    import weft  # noqa: F401 - registers the backend

    torch.cuda.set_device(0)
    dist.init_process_group(
        backend,
        store=dist.PrefixStore("torch/", store),
        rank=rank,
        world_size=size,
        timeout=timedelta(seconds=300),
    )
    rows = []
    for nbytes in byte_sizes:
        t = torch.ones(nbytes // 4, dtype=torch.float32, device="cuda")
        dist.all_reduce(t)
        wrong = int((t != size).sum().item())
        for _ in range(warmup):
            dist.all_reduce(t)
        dist.barrier()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t)
        torch.cuda.synchronize()
        rows.append({"bytes": nbytes, "seconds": (time.perf_counter() - start) / iters})
        rows[-1]["wrong"] = wrong
        del t
    dist.destroy_process_group()
    return rows


def run_system(name, backend, size, env, args, byte_sizes) -> dict:
    import weft.local

    system = {"name": name, "backend": backend, "world_size": size, "env": env}
    try:
        per_rank = weft.local.spawn(
            rank_main, size, backend, byte_sizes, args.iters, args.warmup, env=env, timeout=3600
        )
    except RuntimeError as exc:
        system.update(status="failed", reason=str(exc).strip().splitlines()[-1])
        print(f"{name}: failed: {system['reason']}", file=sys.stderr)
        return system
    results = []
    for i, nbytes in enumerate(byte_sizes):
        seconds = max(rows[i]["seconds"] for rows in per_rank)
        algbw = nbytes / seconds / 1e9
        results.append(
            {
                "bytes": nbytes,
                "time_us": seconds * 1e6,
                "algbw_GBps": algbw,
                "busbw_GBps": algbw * 2 * (size - 1) / size,
                "wrong": sum(rows[i]["wrong"] for rows in per_rank),
            }
        )
    system.update(status="ok", results=results)
    return system


def human(nbytes: int) -> str:
    for unit, factor in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= factor and nbytes % factor == 0:
            return f"{nbytes // factor} {unit}iB"
    return f"{nbytes} B"


def print_table(systems: list[dict]) -> None:
    done = [s for s in systems if s["status"] == "ok"]
    header = "".join(f" | {s['name']:>26}" for s in done)
    print(f"{'size':>9}{header}")
    print(f"{'':>9}" + " | busbw GB/s   time/call us" * len(done))
    for i, row in enumerate(done[0]["results"] if done else []):
        cells = "".join(
            f" | {s['results'][i]['busbw_GBps']:10.2f} {s['results'][i]['time_us']:14.1f}"
            for s in done
        )
        print(f"{human(row['bytes']):>9}{cells}")


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (bw, lat) = plt.subplots(1, 2, figsize=(12, 4.5))
    for system in report["systems"]:
        if system["status"] != "ok":
            continue
        x = [r["bytes"] for r in system["results"]]
        if system["world_size"] > 1:
            bw.plot(
                x, [r["busbw_GBps"] for r in system["results"]], marker="o", label=system["name"]
            )
        lat.plot(x, [r["time_us"] for r in system["results"]], marker="o", label=system["name"])
    for ax, label in ((bw, "busbw (GB/s)"), (lat, "time per call (µs)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("bytes per rank")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"allreduce float32 sum, all ranks on one {report['device']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-b", "--minbytes", default="8K")
    parser.add_argument("-e", "--maxbytes", default="1G")
    parser.add_argument("-f", "--stepfactor", type=int, default=4)
    parser.add_argument("-n", "--iters", type=int, default=20)
    parser.add_argument("-w", "--warmup", type=int, default=3)
    parser.add_argument("--ranks", default="2,4", help="weft world sizes, comma separated")
    parser.add_argument("--out", type=Path, default=RESULTS, help="directory for JSON and PNG")
    args = parser.parse_args()
    reason = no_gpu_reason()
    if reason:
        sys.exit(f"gpu_allreduce: nothing to measure: {reason}")

    import torch
    import torch.distributed as dist

    byte_sizes = sizes(parse_size(args.minbytes), parse_size(args.maxbytes), args.stepfactor)
    systems = [
        run_system(
            f"weft cuda_ipc, {n} ranks", "weft", n, {"WEFT_CUDA_PATH": "ipc"}, args, byte_sizes
        )
        for n in (int(r) for r in args.ranks.split(","))
    ]
    import weft.cuda

    for name, env in (
        ("weft nccl, 1 rank", {"WEFT_CUDA_PATH": "nccl"}),
        ("weft nccl plans, 1 rank", {"WEFT_CUDA_PATH": "nccl", "WEFT_NCCL_MODE": "plans"}),
    ):
        if weft.cuda.nccl_version():
            systems.append(run_system(name, "weft", 1, env, args, byte_sizes))
        else:
            systems.append({"name": name, "status": "skipped", "reason": "weft built without NCCL"})
    if dist.is_nccl_available():
        systems.append(run_system("nccl, 1 rank", "nccl", 1, {}, args, byte_sizes))
    else:
        systems.append({"name": "nccl, 1 rank", "status": "skipped", "reason": "torch has no NCCL"})

    props = torch.cuda.get_device_properties(0)
    report = {
        "format": "weft-gpu-allreduce/1",
        "command": " ".join(sys.argv),
        "device": props.name,
        "compute_capability": f"{props.major}.{props.minor}",
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "nccl": str(torch.cuda.nccl.version()) if dist.is_nccl_available() else None,
        "weft_nccl": weft.cuda.nccl_version(),
        "config": {
            "dtype": "float32",
            "op": "sum",
            "in_place": True,
            "iters": args.iters,
            "warmup": args.warmup,
            "timing": "host clock over iters calls up to torch.cuda.synchronize(); slowest rank",
            "bandwidth": "nccl-tests: algbw = bytes / time, busbw = algbw * 2(n-1)/n",
        },
        "systems": systems,
    }
    print(f"allreduce on {props.name}")
    print_table(systems)
    slug = device_slug(props.name)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"gpu_allreduce_{slug}.json").write_text(json.dumps(report, indent=1) + "\n")
    plot(report, args.out / f"gpu_allreduce_{slug}.png")
    print(f"wrote {args.out}/gpu_allreduce_{slug}.{{json,png}}")
    wrong = sum(r["wrong"] for s in systems if s["status"] == "ok" for r in s["results"])
    failed = [s["name"] for s in systems if s["status"] == "failed"]
    if wrong or failed:
        sys.exit(f"gpu_allreduce: {wrong} wrong elements; failed: {', '.join(failed) or 'none'}")


if __name__ == "__main__":
    main()
