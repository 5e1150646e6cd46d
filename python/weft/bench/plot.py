"""--plot: busbw against size, one panel per op and in it one line per system, each op in
its compared form (the one every peer offers)."""

from __future__ import annotations

import math
from pathlib import Path

from weft.bench.ops import OPS
from weft.bench.sizes import human


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullLocator

    config, machine = report["config"], report["machine"]
    systems = [s["name"] for s in report["systems"]]
    ops = config["ops"]
    ncols = min(3, len(ops))
    nrows = math.ceil(len(ops) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5 * ncols + 1, 4 * nrows + 1), squeeze=False)
    for ax in axes.flat[len(ops) :]:
        ax.remove()
    for ax, op in zip(axes.flat, ops):
        in_place = OPS[op].compared_in_place
        sizes: set[int] = set()
        for i, name in enumerate(systems):
            rows = sorted(
                (r["bytes"], r["busbw_GBps"])
                for r in report["results"]
                if r["system"] == name and r["op"] == op and r["in_place"] == in_place
            )
            if rows:
                sizes.update(b for b, _ in rows)
                x, y = zip(*rows)
                ax.plot(x, y, color=f"C{i % 10}", marker="o", markersize=3, label=name)
        ax.set_title(f"{op} ({'in place' if in_place else 'out of place'})")
        ax.set_xlabel(f"size (B, {config['dtype']}, nccl-tests' size)")
        ax.set_ylabel("busbw (GB/s)")
        ax.grid(True, which="both", alpha=0.3)
        if sizes:
            ordered = sorted(sizes)
            ticks = ordered[:: max(1, (len(ordered) + 7) // 8)]  # about 8 labels
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xticks(ticks, [human(s) for s in ticks], rotation=45)
            ax.xaxis.set_minor_locator(NullLocator())
            ax.legend(fontsize="small")
    fig.suptitle(
        f"weft-bench, {config['world_size']} ranks: busbw as in nccl-tests\n"
        f"({machine.get('cpu_model')}, {machine.get('cores')} cores, "
        f"{machine.get('date', '')[:10]})"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)
