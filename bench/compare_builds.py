"""Two builds of weft side by side: the same weft-bench command run with each, taking turns.

Each build is a directory that holds the `weft` package (an install with ``pip install
--target DIR``, say); every repeat runs the command once per build, the builds' order
alternating, and the report gives each (system, op, size, form) the median per-call time of each
build over the repeats, their ratio and the spread. Use it to show that a change kept a speed:

    python bench/compare_builds.py --build before=/tmp/old --build after=/tmp/new --repeats 3 \\
        --json bench/results/x.json --plot bench/results/x.png -- -o all_reduce --algo ring

A setting of the installed build can be compared the same way: an empty DIR takes the installed
`weft`, and ``--env NAME:VAR=VALUE`` sets a variable for one build's launches
(``--build two= --build one= --env one:WEFT_CHANNELS=1``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def run_once(path: str, extra_env: dict, bench_args: list[str], timeout: float) -> dict:
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "report.json"
        env = {**os.environ, **extra_env}
        if path:
            env["PYTHONPATH"] = path
        cmd = [sys.executable, "-m", "weft.bench", *bench_args, f"--json={out}"]
        subprocess.run(cmd, env=env, check=True, timeout=timeout, stdout=subprocess.DEVNULL)
        return json.loads(out.read_text())


def compare(
    builds: dict[str, str],
    envs: dict[str, dict],
    bench_args: list[str],
    repeats: int,
    timeout: float,
) -> dict:
    times: dict[tuple, dict[str, list[float]]] = {}
    cpu: dict[tuple, dict[str, list[float]]] = {}
    names = list(builds)
    for repeat in range(repeats):
        for name in names[repeat % 2 :] + names[: repeat % 2]:
            for r in run_once(builds[name], envs.get(name, {}), bench_args, timeout)["results"]:
                key = (r["system"], r["op"], r["bytes"], r["in_place"])
                times.setdefault(key, {n: [] for n in names})[name].append(r["time_us"])
                if "cpu_us" in r:
                    cpu.setdefault(key, {n: [] for n in names})[name].append(r["cpu_us"])
    first, second = names
    rows = []
    for (system, op, nbytes, in_place), by_build in sorted(times.items()):
        if not all(by_build.values()):
            continue
        medians = {n: statistics.median(t) for n, t in by_build.items()}
        row = {
            "system": system,
            "op": op,
            "bytes": nbytes,
            "in_place": in_place,
            "time_us": by_build,
            "median_us": medians,
            f"{second}/{first}": round(medians[second] / medians[first], 3),
        }
        spent = cpu.get((system, op, nbytes, in_place), {})
        if spent and all(spent.values()):
            row["median_cpu_us"] = {n: statistics.median(c) for n, c in spent.items()}
        rows.append(row)
    return {
        "command": " ".join(["python bench/compare_builds.py", *sys.argv[1:]]),
        "builds": names,
        "timing": "per build and repeat, weft-bench's per-call time (us); medians over repeats; "
        "median_cpu_us: weft-bench's CPU time per call summed over the ranks (user and system)",
        "rows": rows,
    }


def write_plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    first, second = report["builds"]
    key = f"{second}/{first}"
    fig, ax = plt.subplots(figsize=(8, 4.5))
    series: dict[str, list] = {}
    for r in report["rows"]:
        form = "in place" if r["in_place"] else "out of place"
        series.setdefault(f"{r['system']} {r['op']} {form}", []).append((r["bytes"], r[key]))
    for label, points in series.items():
        ax.plot(*zip(*points), marker="o", label=label)
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("bytes per rank")
    ax.set_ylabel(f"time {key} (median)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def markdown(report: dict) -> str:
    first, second = report["builds"]
    key = f"{second}/{first}"
    lines = [
        f"`{report['command']}`",
        "",
        f"| system | op | bytes | form | {first} us | {second} us | {key} | CPU us {first} / "
        f"{second} |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        m = r["median_us"]
        c = r.get("median_cpu_us")
        form = "in place" if r["in_place"] else "out of place"
        spent = f"{c[first]:.0f} / {c[second]:.0f}" if c else "-"
        lines.append(
            f"| {r['system']} | {r['op']} | {r['bytes']} | {form} | {m[first]:.1f} | "
            f"{m[second]:.1f} | {r[key]:.2f} | {spent} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", action="append", required=True, metavar="NAME=DIR")
    parser.add_argument("--env", action="append", default=[], metavar="NAME:VAR=VALUE")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--plot", type=Path, required=True)
    parser.add_argument("bench_args", nargs=argparse.REMAINDER, help="-- then weft-bench's flags")
    args = parser.parse_args()
    builds = dict(b.split("=", 1) for b in args.build)
    if len(builds) != 2:
        sys.exit("compare_builds: give exactly two --build NAME=DIR")
    envs: dict[str, dict] = {}
    for setting in args.env:
        name, _, assignment = setting.partition(":")
        var, eq, value = assignment.partition("=")
        if name not in builds or not eq:
            sys.exit(f"compare_builds: --env {setting!r}: give NAME:VAR=VALUE for a --build NAME")
        envs.setdefault(name, {})[var] = value
    bench_args = [a for a in args.bench_args if a != "--"]
    report = compare(builds, envs, bench_args, args.repeats, args.timeout)
    args.json.write_text(json.dumps(report, indent=1) + "\n")
    write_plot(report, args.plot)
    print(markdown(report), end="")


if __name__ == "__main__":
    main()
