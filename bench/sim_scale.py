"""How fast weft.topo.simulate is at scale, next to ASTRA-sim's figure from issue 44.

    python bench/sim_scale.py [--only ring|hier|hier65536]

Event simulations, each in a fresh process: a ring allreduce of 1 MiB on a 4096-rank ring
topology, and the hierarchical allreduce of 1 MiB on 8192 ranks (1024 hosts of 8: NVLink inside,
a NIC each outside, one network switch) and on 65536 ranks (8192 hosts of 8). Each reports the
wall and CPU time of the whole call (making every rank's Plan in C++ on every core, packing it,
routing, simulating on one core), the process's peak RSS and its RSS before the call (Python with
weft and torch imported), the messages simulated and the simulated time.
ASTRA-sim, measured on this kind of machine (the issue): 125 s and 7.3 GB for one 1 MiB
allreduce on a 4096-rank ring.

Across a power of two of hosts (from 4), hier allreduces the shards by recursive halving and
doubling: 2 log2(hosts) link messages a rank, where a ring across 8192 hosts would take
2 x 8191 (1.07e9 messages in all at 1 MiB).

Writes bench/results/sim_scale.{json,md,png}.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
ASTRA_SIM = {"case": "ring", "wall_s": 125.0, "peak_rss_gb": 7.3}

CASES = {
    "ring": {
        "title": "ring allreduce, 1 MiB, 4096-rank ring",
        "topology": "Topology.ring(4096)",
        "family": "ring",
        "nbytes": 1 << 20,
    },
    "hier": {
        "title": "hier allreduce, 1 MiB, 8192 ranks (1024 hosts x 8)",
        "topology": "Topology.hosts(1024, 8)",
        "family": "hier",
        "nbytes": 1 << 20,
    },
    "hier65536": {
        "title": "hier allreduce, 1 MiB, 65536 ranks (8192 hosts x 8)",
        "topology": "Topology.hosts(8192, 8)",
        "family": "hier",
        "nbytes": 1 << 20,
    },
}

CHILD = """
import json, os, resource, sys, time
from weft import topo
from weft.topo import Topology
case = json.loads(sys.argv[1])
rss = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # kB -> GB
before = rss()
load = os.getloadavg()[0]
start, cpu = time.perf_counter(), time.process_time()
world = eval(case["topology"])
built = time.perf_counter()
r = topo.simulate(case["family"], world, case["nbytes"])
done = time.perf_counter()
print(json.dumps({"wall_s": done - start, "cpu_s": time.process_time() - cpu,
                  "load_average": load, "topology_s": built - start,
                  "peak_rss_gb": rss(), "rss_before_gb": before, "ranks": r.ranks,
                  "messages": r.messages, "simulated_s": r.time_s,
                  "busbw_GBps": r.busbw / 1e9, "fraction": r.fraction}))
"""


def run_case(name: str) -> dict:
    case = CASES[name]
    out = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(case)],
        check=True,
        capture_output=True,
        text=True,
        timeout=900,
    )
    return {"case": name, **case, **json.loads(out.stdout.strip().splitlines()[-1])}


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.machine()


def write_md(results: list[dict], path: Path) -> None:
    lines = [
        "# weft.topo.simulate at scale",
        "",
        f"{datetime.now(timezone.utc):%Y-%m-%d}, {cpu_model()} ({os.cpu_count()} cores), "
        "`python bench/sim_scale.py` (each case in a fresh process; wall time of the whole "
        "simulate() call, Plans made and packed in C++ included; RSS of the process, Python "
        "and torch included).",
        "",
        "| case | wall (s) | CPU (s) | load average | peak RSS (GB) | RSS before (GB) | messages "
        "| simulated time |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r['title']} | {r['wall_s']:.2f} | {r['cpu_s']:.2f} | {r['load_average']:.1f} | "
            f"{r['peak_rss_gb']:.2f} | "
            f"{r['rss_before_gb']:.2f} | {r['messages']:,} | {r['simulated_s'] * 1e3:.3f} ms |"
        )
    lines.append(
        f"| ASTRA-sim (issue 44): ring allreduce, 1 MiB, 4096-rank ring | "
        f"{ASTRA_SIM['wall_s']:.0f} | | | {ASTRA_SIM['peak_rss_gb']} | | | |"
    )
    lines += [
        "",
        "Across 1024 and 8192 hosts hier's link phase is recursive halving and doubling: "
        "2 log2(hosts) link messages a rank (a ring across 8192 hosts would be 2 x 8191, "
        "1.07e9 messages in all). "
        "Each batch of ranks' Plans is made on every core, so the CPU time (all threads) exceeds "
        "the wall time; the simulation itself runs on one.",
    ]
    path.write_text("\n".join(lines) + "\n")


def write_png(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(10, 3.8))
    labels = [r["title"].replace(", ", "\n", 1) for r in results] + ["ASTRA-sim\nring, 1 MiB, 4096"]
    walls = [r["wall_s"] for r in results] + [ASTRA_SIM["wall_s"]]
    cpus = [r["cpu_s"] for r in results]
    rss = [r["peak_rss_gb"] for r in results] + [ASTRA_SIM["peak_rss_gb"]]
    colours = ["tab:blue"] * len(results) + ["tab:gray"]
    ax_t.barh(labels, walls, color=colours, label="wall")
    ax_t.barh(labels[: len(cpus)], cpus, color="tab:orange", height=0.4, label="CPU (weft)")
    ax_t.set_xlabel("seconds")
    ax_t.legend(fontsize=7, loc="lower right")
    ax_m.barh(labels, rss, color=colours)
    ax_m.set_xlabel("peak RSS (GB)")
    ax_m.set_yticks([])
    for ax, values, unit in ((ax_t, walls, "s"), (ax_m, rss, "GB")):
        for i, v in enumerate(values):
            ax.text(v, i, f" {v:.3g} {unit}", va="center", fontsize=8)
    fig.suptitle("weft.topo.simulate: one allreduce, event simulation (blue) vs ASTRA-sim (gray)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", choices=list(CASES))
    args = parser.parse_args()
    results = [run_case(name) for name in CASES if args.only in (None, name)]
    for r in results:
        print(f"{r['title']}: {r['wall_s']:.2f} s, {r['peak_rss_gb']:.2f} GB peak RSS")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "sim_scale.json").write_text(
        json.dumps({"astra_sim": ASTRA_SIM, "results": results}, indent=1) + "\n"
    )
    write_md(results, RESULTS / "sim_scale.md")
    write_png(results, RESULTS / "sim_scale.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
