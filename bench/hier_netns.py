"""Allreduce algorithms across rate-limited "hosts": network namespaces on this machine.

Starts HOSTS x PER_HOST ranks in namespaces (weft.netns) whose links are limited to --rate
Mbit/s with tc tbf, runs weft-bench there once (weft's algorithms sharing the launch, then each
peer of --vs), and writes its report as JSON and a plot. Needs root; with OpenMPI among the
peers, OpenMPI's mpirun starts the ranks (each namespace one of its nodes, so it uses shared
memory inside a host and tcp over the limited link between hosts).

    python bench/hier_netns.py --hosts 2 --per-host 2 --rate 1000 --vs gloo,mpi \\
        --json bench/results/hier_2x2_1gbit.json --plot bench/results/hier_2x2_1gbit.png
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import weft.netns
from weft.bench.plot import plot

STORE_PORT = 29500  # each namespace has its own ports


def run(net, args, out: Path) -> dict:
    """One weft-bench launch on every rank: weft's algorithms (sharing the launch, taking turns
    at every size) and the peers."""
    bench = [sys.executable, "-m", "weft.bench", "-o", "all_reduce", "-b", args.b, "-e", args.e]
    bench += ["-f", "4", "-n", str(args.n), "--iter-bytes", args.iter_bytes, "-w", "1"]
    bench += ["--rounds", str(args.rounds), "--repeats", str(args.repeats)]
    bench += ["--algo", args.algos, "--vs", args.vs, f"--json={out}"]
    bench += ["--channels", args.channels] if args.channels else []
    # weft's settings come from --algos alone; WEFT_DEBUG passes, to log what the tuner tried.
    env = {k: v for k, v in os.environ.items() if not k.startswith("WEFT_") or k == "WEFT_DEBUG"}
    # The report comes back as JSON; the summary is what this script prints.
    if "mpi" in args.vs.split(","):
        env.update(MASTER_ADDR=net.ips[0], MASTER_PORT=str(STORE_PORT))
        env["GLOO_SOCKET_IFNAME"] = "eth0"  # the host's link, not what the hostname resolves to
        procs = [net.mpirun(args.per_host, bench, env, stdout=subprocess.DEVNULL)]
    else:
        procs = net.spawn_world(args.per_host, bench, env, STORE_PORT, stdout=subprocess.DEVNULL)
    for proc in procs:
        if proc.wait(timeout=args.timeout) != 0:
            sys.exit(f"weft-bench failed: exit {proc.returncode}")
    return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--per-host", type=int, default=2)
    parser.add_argument("--rate", type=float, default=1000, help="Mbit/s per host link")
    parser.add_argument("--algos", default="ring,rhd,tree,hier,auto")
    parser.add_argument("--vs", default="gloo", help="weft-bench's peers: gloo, mpi")
    parser.add_argument("--channels", help="weft-bench's (connection sets per peer, a list)")
    parser.add_argument("-b", default="64K")
    parser.add_argument("-e", default="64M")
    parser.add_argument("-n", type=int, default=5)
    parser.add_argument("--iter-bytes", default="0", help="weft-bench's (more calls when small)")
    parser.add_argument("--rounds", type=int, default=1, help="weft-bench's (median block)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=3600)
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--plot", type=Path, required=True)
    args = parser.parse_args()
    reason = weft.netns.unavailable()
    if reason:
        sys.exit(f"hier_netns: {reason}")
    with (
        weft.netns.Hosts(args.hosts, rate_mbit=args.rate) as net,
        tempfile.TemporaryDirectory() as d,
    ):
        report = run(net, args, Path(d) / "report.json")
    report["config"]["layout"] = f"{args.hosts} hosts x {args.per_host} ranks, {args.rate} Mbit/s"
    args.json.write_text(json.dumps(report, indent=1) + "\n")
    plot(report, args.plot)
    print(summary(report))


def summary(report: dict) -> str:
    """The command, when and where it ran, and busbw (GB/s) per size and system, in-place
    allreduce, as markdown."""
    machine = report["machine"]
    header = [
        f"`python bench/hier_netns.py {shlex.join(sys.argv[1:])}`",
        "",
        f"{machine['date'][:10]}, {machine['cpu_model']} ({machine['cores']} cores, load average "
        f"{machine['load_average']} at the start), {report['config']['layout']}: busbw (GB/s) of "
        "the in-place allreduce.",
        "",
    ]
    names = [s["name"] for s in report["systems"]]
    table: dict[int, dict[str, float]] = {}
    for r in report["results"]:
        if r["in_place"]:
            table.setdefault(r["bytes"], {})[r["system"]] = r["busbw_GBps"]
    lines = header + ["| bytes | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for nbytes in sorted(table):
        row = table[nbytes]
        lines.append(
            f"| {nbytes} | " + " | ".join(f"{row.get(n, float('nan')):.3f}" for n in names) + " |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
