"""weft-bench: bandwidth of weft's collectives, side by side with gloo, MPI and NCCL.

Flags as in nccl-tests. Without a launcher it starts --np local ranks per system itself;
under torchrun, srun or mpirun it uses their ranks. See docs/benchmark.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from pathlib import Path

from weft.bench import launch, lineup, report, results, tune
from weft.bench.machine import machine_info
from weft.bench.ops import DTYPES, OPS
from weft.bench.plot import plot
from weft.bench.progress import Progress
from weft.bench.sizes import MAX_ITERS_FACTOR, parse_size, sweep

TIMING = (
    "per call, the mean over -n iterations (more with --iter-bytes) started together after a "
    "barrier (nccl-tests' method), of the slowest rank, in us; with rounds, the iterations "
    "split into that many blocks, each after a barrier, the variants of a launch taking turns "
    "block by block, and the median over the blocks; with repeats, the median over the launches"
)
BANDWIDTH = "algbw = size / time, busbw = algbw x the op's factor as in nccl-tests; GB = 1e9 B"


def comma_list(choices):
    def parse(text: str) -> list[str]:
        items = [x.strip() for x in text.split(",") if x.strip()]
        bad = [x for x in items if choices is not None and x not in choices]
        if bad:
            raise argparse.ArgumentTypeError(f"{bad}: choose from {', '.join(choices)}")
        return items

    return parse


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="weft-bench", description=__doc__.split("\n\n")[0])
    add = p.add_argument
    add("-b", "--minbytes", type=parse_size, default=parse_size("8"), help="default 8")
    add("-e", "--maxbytes", type=parse_size, default=parse_size("64M"), help="default 64M")
    add("-f", "--stepfactor", type=int, default=2, help="default %(default)s")
    add("-n", "--iters", type=int, default=20, help="timed iterations, default %(default)s")
    add("-w", "--warmup_iters", type=int, default=5, help="default %(default)s")
    add(
        "--iter-bytes",
        type=parse_size,
        default=0,
        help="more timed calls than -n at small sizes, until they move this many bytes (at most "
        f"{MAX_ITERS_FACTOR}x -n): one descheduling then skews fewer of them; default off",
    )
    add("-c", "--check", type=int, choices=(0, 1), default=1, help="check results (#wrong)")
    ops = ["all", *OPS]
    add("-o", "--op", type=comma_list(ops), default=["all_reduce"], help=", ".join(ops))
    add("-d", "--datatype", choices=list(DTYPES), default="float", help="default float")
    add(
        "-r",
        "--root",
        type=int,
        help="root of broadcast and reduce, for every system; default 0, or the root of a "
        "broadcast's or reduce's --plan or --msccl file, which -r, where given, must match (an "
        "in-place MSCCL reduce that several ranks write is run with -r as its root)",
    )
    add("--np", type=int, help="ranks to launch (default 2; under a launcher: its ranks)")
    add("--vs", type=comma_list(lineup.PEERS), default=[], help=f"peers: {', '.join(lineup.PEERS)}")
    add(
        "--channels",
        type=comma_list([str(n) for n in range(1, 17)]),
        default=[],
        help="weft's connection sets per peer (WEFT_CHANNELS), a comma list: each a variant "
        "of its own in the same launch; default $WEFT_CHANNELS or 2",
    )
    add(
        "--plan",
        type=Path,
        action="append",
        default=[],
        metavar="FILE",
        help="also measure the weft.topo Algorithm in FILE (JSON), checked first; repeatable",
    )
    add(
        "--msccl",
        type=Path,
        action="append",
        default=[],
        metavar="FILE",
        help="also measure the MSCCL algorithm in FILE (XML), imported and checked; repeatable",
    )
    add(
        "--algo",
        type=comma_list(None),
        default=[os.environ.get("WEFT_ALGO") or "auto"],
        help="weft's algorithms (WEFT_ALGO), comma list or 'all'; default $WEFT_ALGO or auto",
    )
    add(
        "--transport",
        type=comma_list(["auto", "all", *lineup.TRANSPORTS, *lineup.RDMA_TRANSPORTS]),
        default=[os.environ.get("WEFT_TRANSPORT") or "auto"],
        help="weft's transports (WEFT_TRANSPORT): auto, shm, tcp, ofi, ibverbs, all (shm and tcp); "
        "default $WEFT_TRANSPORT",
    )
    add(
        "--rounds",
        type=int,
        default=1,
        help="split the timed calls into this many blocks, the variants of a launch taking "
        "turns block by block; report the median block (default 1: nccl-tests' mean)",
    )
    add("--repeats", type=int, default=1, help="launches per system (median), interleaved")
    add("--json", type=Path, help="write the report as JSON")
    add("--csv", type=Path, help="write the results as CSV")
    add("--plot", type=Path, help="write busbw against size as a PNG")
    add("--timeout", type=float, default=900, help="seconds per launch, default %(default)s")
    add("--mpirun", default="mpirun", help="the mpirun that starts MPI ranks")
    add(
        "--tune",
        type=Path,
        metavar="FILE",
        help="measure the tuner's cost model thoroughly (here: shm and tcp between --np local "
        "ranks; under a launcher: its world's links), write it to FILE for WEFT_TUNE=FILE, and "
        "run no benchmark",
    )
    args = p.parse_args(argv)
    args.channels = [int(n) for n in args.channels]
    if "all" in args.op:
        args.op = list(OPS)
    if "all" in args.transport:
        args.transport = list(lineup.TRANSPORTS)
    if "all" in args.algo and len(args.algo) > 1:
        p.error("--algo all stands alone")
    if args.iters < 1 or args.warmup_iters < 0 or args.repeats < 1 or args.rounds < 1:
        p.error("need -n >= 1, -w >= 0, --rounds >= 1 and --repeats >= 1")
    try:
        args.sizes = sweep(args.minbytes, args.maxbytes, args.stepfactor)
    except ValueError as e:
        p.error(str(e))
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    launcher = launch.detect()
    if launcher and args.np not in (None, launcher.size):
        sys.exit(f"weft-bench: --np {args.np}, but {launcher.name} started {launcher.size}")
    files = lineup.algorithm_files(args.plan, args.msccl, args.root)
    args.root = lineup.run_root(args.root, files)
    size = launcher.size if launcher else (args.np or lineup.ranks_of(files) or 2)
    if args.tune:
        return tune.run(args.tune, size, launcher, args.timeout)
    store = launch.rendezvous(launcher) if launcher else None
    hosts = launch.count_hosts(store, launcher) if launcher else 1
    entries = lineup.weft_entries(args.algo, args.transport, args.op, hosts, args.channels)
    entries += lineup.algorithm_entries(files, args.transport, size)
    if launcher and len(args.transport) > 1:
        sys.exit(
            f"weft-bench: under {launcher.name}, one --transport per run (weft reads "
            "WEFT_TRANSPORT once per process); launch without a launcher for several"
        )
    entries += [lineup.peer_entry(p, args.op, size, launcher, args.mpirun) for p in args.vs]
    if not launcher:
        # Ranks launched here allocate tensors on transparent huge pages, as numpy does by
        # default; torch reads this when a process first allocates, so a launcher's ranks
        # (already running) keep the environment the user gave them.
        os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    plan = {
        "sizes": args.sizes,
        "dtype": args.datatype,
        "iters": args.iters,
        "iter_bytes": args.iter_bytes,
        "rounds": args.rounds,
        "warmup": args.warmup_iters,
        "check": bool(args.check),
        "root": args.root,
    }
    runs = measure(entries, plan, args, size, launcher, store)
    if launcher and launcher.rank != 0:
        return 0
    full = build_report(entries, runs, plan, args, size, launcher, argv)
    print(report.table(full), end="")
    if args.json:
        report.write_json(full, args.json)
    if args.csv:
        report.write_csv(full["results"], args.csv)
    if args.plot:
        plot(full, args.plot)
    wrong = any(r["wrong"] for r in full["results"])
    failed = any(e.status == "failed" for e in entries)
    return 1 if wrong or failed else 0


def measure(entries, plan, args, size, launcher, store) -> dict[str, list[dict]]:
    """Runs every ready system --repeats times, interleaved (the order rotates each round so
    that a drift in background load hits all alike); returns each system's launches. weft's
    algorithms over one transport share a launch and take turns at each size (see
    launch_groups)."""
    groups = launch_groups([e for e in entries if e.status == "ok"])
    runs: dict[str, list[dict]] = {e.name: [] for e in entries}
    on_rank0 = launcher is None or launcher.rank == 0
    total = sum(len(e.ops) for g in groups for e in g) * len(plan["sizes"]) * args.repeats
    progress = Progress(total, shown=on_rank0)
    try:
        for repeat in range(args.repeats):
            shift = repeat % max(1, len(groups))
            for group in groups[shift:] + groups[:shift]:
                group = [e for e in group if e.status == "ok"]
                if group:
                    shown = progress if on_rank0 else None
                    run_group(group, repeat, plan, args, size, launcher, store, shown, runs)
    finally:
        progress.close()
    return runs


def launch_groups(ready: list) -> list[list]:
    """The launches of one round: weft's variants of one transport together (each algorithm
    on its own communicator, so they meet the same placement of ranks on CPUs, which on a
    crowded machine changes from launch to launch), every other system alone."""
    groups: dict[str, list] = {}
    for e in ready:
        key = f"weft {e.env.get('WEFT_TRANSPORT')}" if e.kind == "weft" else e.name
        groups.setdefault(key, []).append(e)
    return list(groups.values())


def run_group(group, repeat, plan, args, size, launcher, store, progress, runs) -> None:
    """One launch of `group` (the variants' order rotates with `repeat`); its entries fail
    together. `progress` is None where this process shows none."""
    first = group[0]
    name = "+".join(e.name for e in group)
    steps = sum(len(e.ops) for e in group) * len(plan["sizes"])
    path = progress.launch(name, steps) if progress else None
    job = {
        "plan": {**plan, "ops": list(dict.fromkeys(op for e in group for op in e.ops))},
        "progress": path,
        "variants": [
            {
                "name": e.name,
                "algo": e.env.get("WEFT_ALGO"),
                "ops": e.ops,
                "plan": e.plan,
                "channels": e.channels,
            }
            for e in group[repeat % len(group) :] + group[: repeat % len(group)]
        ],
    }
    env = {k: v for k, v in first.env.items() if k != "WEFT_ALGO"}  # each variant sets its own
    try:
        if launcher:
            os.environ.update(first.env)  # weft reads it at its first communicator
            key = f"bench/{name}/{repeat}"
            out = launch.run_in_process(first.kind, job, launcher, store, key)
        else:
            out = launch.run_local(first.kind, env, job, size, args.timeout, args.mpirun)
    except Exception as exc:
        if launcher:
            raise  # the launcher stops the other ranks
        for e in group:
            e.status, e.reason = "failed", last_line(str(exc))
        print(f"weft-bench: {name} failed:\n{exc}", file=sys.stderr)
        return
    if out is None:
        return
    for e in group:
        if "library" in out:
            e.info["library"] = out["library"]
        runs[e.name].append(results.combine_ranks([r[e.name] for r in out["per_rank"]]))


def last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else text


def build_report(entries, runs, plan, args, size, launcher, argv) -> dict:
    records = []
    for e in entries:
        if runs[e.name]:
            refused = {op: why for run in runs[e.name] for op, why in run["refused"].items()}
            notes = {n for run in runs[e.name] for n in run["unsupported"]}
            e.info.update(refused=refused, unsupported=sorted(notes))
            if runs[e.name][0]["buffering"]:
                e.info["buffering"] = runs[e.name][0]["buffering"]
            records += results.finish(e.name, runs[e.name], plan, size)
    weft_names = [e.name for e in entries if e.kind == "weft"]
    peers = [e.name for e in entries if e.kind != "weft"]
    config = {
        **plan,
        "world_size": size,
        "launcher": launcher.name if launcher else "launched here",
        "ops": args.op,
        "repeats": args.repeats,
        "huge_pages": os.environ.get("THP_MEM_ALLOC_ENABLE", "0") == "1",
        "timing": TIMING,
        "bandwidth": BANDWIDTH,
    }
    return {
        "command": " ".join(["weft-bench", *argv]),
        "machine": machine_info(args.mpirun),
        "config": config,
        "systems": [e.describe() for e in entries],
        "results": records,
        "ratios": results.ratios(records, weft_names, peers),
    }


def run() -> None:
    """The console script."""
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        traceback.print_exc(limit=0)
        sys.exit(130)
