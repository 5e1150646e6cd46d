"""Bandwidth of weft's CUDA reduce kernel against the device's own copy, measured in one run.

    python bench/gpu_reduce.py [--mib 256] [--iterations 20] [--repeats 5]

For float32 and bfloat16: ``dst = a + b`` over buffers of S bytes each (weft.cuda.reduce, two
inputs), counted as 3*S bytes moved per call, against a device-to-device copy of S bytes
(torch's ``Tensor.copy_`` of contiguous tensors, which is ``cudaMemcpyAsync``), counted as 2*S.
Each is timed with CUDA events around ``iterations`` back-to-back calls on one stream after a
warm-up; the median of ``repeats`` is reported. The goal is a reduce bandwidth of at least 90 %
of the copy's.

Writes bench/results/gpu_reduce_<device>.{json,png}; needs a CUDA device, torch with CUDA and
weft built with CUDA, and says which one is missing otherwise.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
DTYPES = ("float32", "bfloat16")
GOAL = 0.9


def no_gpu_reason() -> str | None:
    import weft.cuda

    if not weft.cuda.is_built():
        return "weft was built without CUDA (no nvcc when it was built)"
    import torch

    if not torch.cuda.is_available():
        return f"no CUDA device (torch {torch.__version__}, torch.cuda.is_available() is False)"
    return None


def device_slug(name: str) -> str:
    """A device name as a file name part: "NVIDIA H200" -> "nvidia_h200"."""
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


def time_per_call(call, iterations: int, repeats: int) -> float:
    """Median seconds per call over ``repeats`` runs of ``iterations`` calls (CUDA events)."""
    import torch

    for _ in range(3):
        call()
    times = []
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iterations):
            call()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / iterations)
    return statistics.median(times)


def copy_seconds(nbytes: int, iterations: int, repeats: int) -> float:
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    return time_per_call(lambda: dst.copy_(src), iterations, repeats)


def reduce_seconds(dtype: str, nbytes: int, iterations: int, repeats: int) -> float:
    import torch
    import weft.cuda

    tdtype = getattr(torch, dtype)
    count = nbytes // tdtype.itemsize
    a = torch.randn(count, dtype=tdtype, device="cuda")
    b = torch.randn(count, dtype=tdtype, device="cuda")
    out = torch.empty_like(a)
    pointers = [a.data_ptr(), b.data_ptr()]
    stream = torch.cuda.current_stream().cuda_stream

    def reduce():
        weft.cuda.reduce(
            out.data_ptr(), pointers, count, dtype, "sum", device=a.device.index, stream=stream
        )

    reduce()
    if not torch.equal(out, a + b):
        sys.exit(f"gpu_reduce: the {dtype} reduce gave a wrong result; not timing it")
    return time_per_call(reduce, iterations, repeats)


def measure(nbytes: int, iterations: int, repeats: int) -> dict:
    seconds = copy_seconds(nbytes, iterations, repeats)
    rows = [
        {
            "name": "cudaMemcpyAsync D2D",
            "dtype": None,
            "bytes_moved": 2 * nbytes,
            "seconds": seconds,
        }
    ]
    for dtype in DTYPES:
        seconds = reduce_seconds(dtype, nbytes, iterations, repeats)
        rows.append(
            {
                "name": f"weft reduce, 2 inputs, {dtype}",
                "dtype": dtype,
                "bytes_moved": 3 * nbytes,
                "seconds": seconds,
            }
        )
    for row in rows:
        row["GBps"] = row["bytes_moved"] / row["seconds"] / 1e9
        row["fraction_of_copy"] = row["GBps"] / rows[0]["GBps"]
    return {"bytes_per_buffer": nbytes, "rows": rows}


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["rows"]
    fig, ax = plt.subplots(figsize=(7, 4))
    bars = ax.bar(
        [r["name"].replace(", ", "\n") for r in rows],
        [r["GBps"] for r in rows],
        color=["grey"] + ["tab:blue"] * (len(rows) - 1),
    )
    for bar, row in zip(bars, rows):
        ax.annotate(
            f"{row['GBps']:.0f} GB/s\n{100 * row['fraction_of_copy']:.0f} %",
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=8,
        )
    ax.axhline(
        GOAL * rows[0]["GBps"],
        color="tab:red",
        linestyle="--",
        linewidth=1,
        label=f"goal: {GOAL:.0%} of the copy",
    )
    ax.set_ylabel("bytes moved per second (GB/s)")
    mib = report["bytes_per_buffer"] >> 20
    ax.set_title(f"{report['device']}: {mib} MiB buffers", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=256, help="size of each buffer in MiB")
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS, help="directory for JSON and PNG")
    args = parser.parse_args()
    reason = no_gpu_reason()
    if reason:
        sys.exit(f"gpu_reduce: nothing to measure: {reason}")

    import torch

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    report = {
        "device": props.name,
        "compute_capability": f"{props.major}.{props.minor}",
        "sms": props.multi_processor_count,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "iterations": args.iterations,
        "repeats": args.repeats,
        **measure(args.mib << 20, args.iterations, args.repeats),
    }
    for row in report["rows"]:
        print(
            f"{row['name']:<34} {row['GBps']:8.1f} GB/s  {100 * row['fraction_of_copy']:5.1f} %"
            " of the copy"
        )
    slug = device_slug(props.name)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"gpu_reduce_{slug}.json").write_text(json.dumps(report, indent=1) + "\n")
    plot(report, args.out / f"gpu_reduce_{slug}.png")
    print(f"wrote {args.out}/gpu_reduce_{slug}.{{json,png}}")


if __name__ == "__main__":
    main()
