"""float32 allreduce at world size 2: weft (shm, tcp) against gloo and OpenMPI, in one run.

    python bench/allreduce_vs_peers.py                  # full run, writes bench/results/
    python bench/allreduce_vs_peers.py --quick          # smoke test, writes to a temp dir
    python bench/allreduce_vs_peers.py --sizes 8,64K,1M --systems gloo,openmpi

Writes allreduce_ws2.json (machine, method, per system per size figures), allreduce_ws2.png
(busbw against size) and allreduce_ws2.md (the table that is also printed to stdout).

Method. Every system runs the same plan: per size, one allreduce whose result is checked,
`warmup` untimed calls, a barrier, then `iterations` timed calls; elapsed / iterations is the
time per call on that rank. Iterations depend on the size only, never on the system:
clamp(bytes_per_timing / size, min_iters, max_iters); warm-up = max(2, iterations // 10).
A run's time per call is the max over ranks. The whole plan runs `--repeats` times per system,
the systems interleaved (run 1 of every system, then run 2, ...; the order rotates each round)
so that background load drifting during the run hits all systems alike. The reported time per
call is the median over the repeats. Bandwidth as in nccl-tests, GB = 1e9 bytes:
algbw = S / t, busbw = algbw * 2(n-1)/n.

Placement (--pin): by default every system runs as its users run it: weft and gloo ranks are
not pinned, OpenMPI binds each rank to a core (its default at -np 2; `--pin all` pins every
system's rank r to core r). Noise is recorded, not removed: the JSON and the table note how
busy the CPUs were before the run and, per launch, the share of time some task waited for a
CPU (Linux PSI); the per-repeat times and their spread are in the JSON.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import importlib.metadata
import importlib.util
import json
import multiprocessing as mp
import os
import platform
import queue
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from _timing import Collective, time_sizes

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
WORLD_SIZE = 2
BUS_FACTOR = 2 * (WORLD_SIZE - 1) / WORLD_SIZE  # allreduce, nccl-tests
DEFAULT_SIZES = "8:64M"  # factor 2: 8 B, 16 B, ..., 64 KiB, ..., 1 MiB, ..., 64 MiB
QUICK_SIZES = "8,4K,64K"
RATIOS = (("weft-shm", "openmpi"), ("weft-shm", "gloo"), ("weft-tcp", "gloo"))
LABELS = {"openmpi": "OpenMPI"}  # display names that differ from the key


class Skipped(Exception):
    """A system that cannot run on this machine; the message says why."""


# ----------------------------------------------------------------------------------------
# Sizes, and the plan that every system runs


def parse_size(text: str) -> int:
    m = re.fullmatch(r"(\d+)\s*([KMG]?)(?:i?B)?", text.strip(), re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"bad size {text!r} (e.g. 8, 64K, 1MiB)")
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2).upper()]


def parse_sizes(text: str) -> list[int]:
    """'8,64K,1M' (a list) or '8:64M' / '8:64M:4' (from:to, by a factor, default 2)."""
    if ":" in text:
        parts = text.split(":")
        size, last = parse_size(parts[0]), parse_size(parts[1])
        factor = int(parts[2]) if len(parts) > 2 else 2
        sizes = []
        while size <= last:
            sizes.append(size)
            size *= factor
    else:
        sizes = [parse_size(part) for part in text.split(",") if part.strip()]
    bad = [s for s in sizes if s <= 0 or s % 4]
    if bad:
        raise argparse.ArgumentTypeError(f"sizes must be multiples of 4 bytes: {bad}")
    return sorted(set(sizes))


def human(nbytes: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


def make_plan(sizes: list[int], args: argparse.Namespace) -> list[dict]:
    plan = []
    for nbytes in sizes:
        iters = max(args.min_iters, args.bytes_per_timing // nbytes)
        iters = min(args.max_iters, iters)
        warmup = max(2, iters // 10)
        plan.append({"bytes": nbytes, "iterations": iters, "warmup": warmup})
    return plan


# ----------------------------------------------------------------------------------------
# The systems. A *_collective function runs in a rank process and returns its Collective;
# a launch_* function runs the plan once on all ranks and returns the per-rank timings.


def weft_collective(rank: int, size: int, store) -> Collective:
    import weft

    comm = weft.Communicator(store, rank, size, name="bench")
    wanted = os.environ["WEFT_TRANSPORT"]  # set by launch_weft_*
    used = {comm.transport_to(peer) for peer in range(size) if peer != rank}
    if used != {wanted}:
        raise RuntimeError(f"WEFT_TRANSPORT={wanted}, but weft uses {sorted(used)}")
    return Collective(lambda buf: comm.allreduce(buf, op="sum"), comm.barrier)


def gloo_collective(rank: int, size: int, store) -> Collective:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", store=store, rank=rank, world_size=size)
    return Collective(dist.all_reduce, dist.barrier, wrap=torch.from_numpy)


def launch_weft_shm(plan: list[dict], opts: argparse.Namespace) -> list[list[dict]]:
    return spawn_ranks(weft_collective, plan, opts, env={"WEFT_TRANSPORT": "shm"})


def launch_weft_tcp(plan: list[dict], opts: argparse.Namespace) -> list[list[dict]]:
    return spawn_ranks(weft_collective, plan, opts, env={"WEFT_TRANSPORT": "tcp"})


def launch_gloo(plan: list[dict], opts: argparse.Namespace) -> list[list[dict]]:
    return spawn_ranks(gloo_collective, plan, opts, env={})


def launch_openmpi(plan: list[dict], opts: argparse.Namespace) -> list[list[dict]]:
    worker = str(BENCH_DIR / "_mpi_allreduce.py")
    with tempfile.TemporaryDirectory(prefix="weft-bench-mpi-") as tmp:
        plan_path, out_path = Path(tmp, "plan.json"), Path(tmp, "out.json")
        plan_path.write_text(json.dumps(plan))
        args = [sys.executable, worker, str(plan_path), str(out_path)]
        run_bounded(mpirun_command(opts) + args, opts.timeout)
        result = json.loads(out_path.read_text())
    opts.mpi_library = result["library"].strip("\0 ")
    return result["per_rank"]


def mpirun_command(opts: argparse.Namespace) -> list[str]:
    # OpenMPI binds each rank to a core by default at -np 2; "--pin none" unbinds them.
    bind = "none" if opts.pin == "none" else "core"
    mpirun = ["mpirun", "--allow-run-as-root", "--oversubscribe"]
    return [*mpirun, "-np", str(WORLD_SIZE), "--bind-to", bind]


def import_weft():
    """`import weft`, falling back on the checkout's python/ folder (an in-place build)."""
    try:
        return importlib.import_module("weft")
    except ImportError:
        in_tree = str(REPO / "python")
        if in_tree in sys.path:
            raise
        sys.path.insert(0, in_tree)  # spawned ranks inherit sys.path
        return importlib.import_module("weft")


def check_weft() -> None:
    try:
        import_weft()
    except ImportError as e:
        raise Skipped(f"weft is not importable: {e}") from e


def check_gloo() -> None:
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        raise Skipped("this torch has no gloo backend")


def check_openmpi() -> None:
    if shutil.which("mpirun") is None:
        raise Skipped("mpirun not found (apt-get install openmpi-bin)")
    if importlib.util.find_spec("mpi4py") is None:
        raise Skipped("mpi4py is not installed")


@dataclass
class System:
    name: str
    check: Callable[[], None]  # raises Skipped
    launch: Callable  # (plan, opts) -> per-rank lists of time_sizes() results
    transport: str


SYSTEMS = {
    s.name: s
    for s in (
        System("weft-shm", check_weft, launch_weft_shm, "WEFT_TRANSPORT=shm"),
        System("weft-tcp", check_weft, launch_weft_tcp, "WEFT_TRANSPORT=tcp, loopback"),
        System("gloo", check_gloo, launch_gloo, "torch.distributed, TCP loopback"),
        System("openmpi", check_openmpi, launch_openmpi, "mpi4py, shared memory"),
    )
}


# ----------------------------------------------------------------------------------------
# Processes, bounded in time


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_main(setup, rank, size, port, env, plan, pin, results) -> None:
    """One spawned rank: environment, CPU pinning, store, then the timing loop."""
    os.environ.update(env)  # before any Communicator exists: weft reads its env once
    try:
        if pin:
            cpus = sorted(os.sched_getaffinity(0))
            os.sched_setaffinity(0, {cpus[rank % len(cpus)]})
        import torch.distributed as dist

        timeout = datetime.timedelta(seconds=60)
        is_server = rank == 0
        store = dist.TCPStore("127.0.0.1", port, size, is_server, timeout)
        timings = time_sizes(setup(rank, size, store), rank, size, plan)
        results.put((rank, True, timings))
    except BaseException:  # noqa: BLE001 - reported to the parent
        results.put((rank, False, traceback.format_exc()))
        return
    leave_together(store, rank, size)


def leave_together(store, rank: int, size: int, timeout_s: float = 30) -> None:
    """Rank 0 hosts the store: it stays until every rank is done with it."""
    store.add("bench/done", 1)
    deadline = time.monotonic() + timeout_s
    while rank == 0 and store.add("bench/done", 0) < size and time.monotonic() < deadline:
        time.sleep(0.01)


def spawn_ranks(setup, plan, opts, env: dict) -> list[list[dict]]:
    """Runs the plan on WORLD_SIZE fresh processes; kills them all on error or timeout."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    pin = opts.pin == "all"
    procs = [
        ctx.Process(
            target=rank_main,
            args=(setup, rank, WORLD_SIZE, port, env, plan, pin, results),
            daemon=True,
        )
        for rank in range(WORLD_SIZE)
    ]
    for p in procs:
        p.start()
    deadline = time.monotonic() + opts.timeout
    collected: dict[int, list[dict]] = {}
    try:
        while len(collected) < WORLD_SIZE:
            try:
                rank, ok, value = results.get(timeout=0.5)
            except queue.Empty:
                check_alive(procs, deadline, opts.timeout)
                continue
            if not ok:
                raise RuntimeError(f"rank {rank} failed:\n{value}")
            collected[rank] = value
    finally:
        for p in procs:
            p.join(timeout=10 if len(collected) == WORLD_SIZE else 0)
            if p.is_alive():
                p.kill()
                p.join()
    return [collected[rank] for rank in range(WORLD_SIZE)]


def check_alive(procs: list, deadline: float, timeout: float) -> None:
    for rank, p in enumerate(procs):
        if p.exitcode not in (None, 0):
            raise RuntimeError(f"rank {rank} died, exit code {p.exitcode}")
    if time.monotonic() > deadline:
        raise TimeoutError(f"ranks still running after {timeout:.0f} s")


def run_bounded(cmd: list[str], timeout: float) -> str:
    """Runs cmd in its own process group; kills the whole group on timeout."""
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise TimeoutError(f"{cmd[0]} still running after {timeout:.0f} s") from None
    if proc.returncode != 0:
        tail = output[-3000:]
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{tail}")
    return output


# ----------------------------------------------------------------------------------------
# Machine description


def read_text(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def command_output(*cmd: str) -> str:
    try:
        run = subprocess.run(cmd, check=False, capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return ""
    return run.stdout.decode(errors="replace").strip()


def version_of(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def weft_location() -> str | None:
    try:
        weft = import_weft()
    except ImportError:
        return None
    return f"{version_of('weft') or getattr(weft, '__version__', '?')} at {weft.__file__}"


def load_average() -> float:
    return float(read_text("/proc/loadavg").split()[0])


def cpu_busy(seconds: float = 2.0) -> float:
    """Fraction of all CPUs busy during `seconds` (before the run: how idle the machine is)."""

    def sample() -> tuple[int, int]:
        ticks = [int(x) for x in read_text("/proc/stat").split("\n")[0].split()[1:]]
        return sum(ticks), ticks[3] + ticks[4]  # total, idle + iowait

    total0, idle0 = sample()
    time.sleep(seconds)
    total1, idle1 = sample()
    return round(1 - (idle1 - idle0) / max(1, total1 - total0), 3)


def cpu_stall_s() -> float:
    """Seconds during which some task waited for a CPU since boot (Linux PSI), 0 if absent."""
    m = re.search(r"^some .*total=(\d+)", read_text("/proc/pressure/cpu"), re.MULTILINE)
    return int(m.group(1)) / 1e6 if m else 0.0


def machine_info() -> dict:
    cpuinfo, meminfo = read_text("/proc/cpuinfo"), read_text("/proc/meminfo")
    first_cpu = cpuinfo.split("\n\n")[0]
    cpu = dict(re.findall(r"^([^\t:]+?)\s*:\s*(.*)$", first_cpu, re.MULTILINE))
    flags = set(cpu.get("flags", "").split())
    mem_kib = re.search(r"^MemTotal:\s*(\d+) kB", meminfo, re.MULTILINE)
    mpirun = command_output("mpirun", "--version").splitlines()
    now = datetime.datetime.now(datetime.timezone.utc)
    git = ("git", "-C", str(REPO))
    return {
        "date": now.isoformat(timespec="seconds"),
        "hostname": socket.gethostname(),
        "cpu_model": cpu.get("model name") or platform.processor(),
        "cpu_family_model": f"family {cpu.get('cpu family')} model {cpu.get('model')}",
        "cpu_simd": sorted(flags & {"avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl"}),
        "virtualized": "hypervisor" in flags,
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)),
        "memory_gib": round(int(mem_kib.group(1)) / 2**20, 1) if mem_kib else None,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "torch": version_of("torch"),
        "numpy": version_of("numpy"),
        "mpi4py": version_of("mpi4py"),
        "openmpi": mpirun[0] if mpirun else None,
        "weft": weft_location(),
        "weft_commit": command_output(*git, "describe", "--always", "--dirty"),
    }


# ----------------------------------------------------------------------------------------
# From raw timings to the three reports


def summarize(plan: list[dict], runs: list[list[list[dict]]]) -> list[dict]:
    """runs[repeat][rank][size index] -> one record per size (median over repeats)."""
    rows = []
    for i, entry in enumerate(plan):
        slowest = [max(rank[i]["elapsed_s"] for rank in run) for run in runs]
        per_call = [elapsed / entry["iterations"] for elapsed in slowest]
        t = statistics.median(per_call)
        algbw = entry["bytes"] / t / 1e9
        row = dict(entry)
        row["time_us"] = sig(t * 1e6)
        row["time_us_repeats"] = [sig(x * 1e6) for x in per_call]
        row["spread"] = sig(max(per_call) / min(per_call))  # max / min over repeats
        row["algbw_GBps"] = sig(algbw)
        row["busbw_GBps"] = sig(algbw * BUS_FACTOR)
        row["check_ok"] = all(rank[i]["check_ok"] for run in runs for rank in run)
        rows.append(row)
    return rows


def sig(x: float, digits: int = 4) -> float:
    return float(f"{x:.{digits}g}")


def by_size(results: list[dict]) -> dict[int, dict]:
    return {row["bytes"]: row for row in results}


def label(name: str) -> str:
    return LABELS.get(name, name)


def fmt(x: float | None) -> str:
    if x is None:
        return "–"
    return f"{x:.0f}" if x >= 100 else f"{x:.3g}"


def fmt_ratio(x: float) -> str:
    return f"{x:.2f}" if 0.1 <= x < 10 else fmt(x)


def noise_note(report: dict) -> str:
    waits = [
        f"{label(name)} {min(w):.0%}–{max(w):.0%}"
        for name, s in report["systems"].items()
        if (w := s.get("cpu_wait_fraction"))
    ]
    note = f"noise: the CPUs were {report['cpu_busy_before_start']:.0%} busy just before"
    if waits:
        note += f"; share of time some task waited for a CPU (Linux PSI): {', '.join(waits)}"
    return note + f"; whole run {report['duration_s']:.0f} s"


def markdown_table(report: dict) -> str:
    systems, info = report["systems"], report["machine"]
    rows = {name: by_size(s.get("results", ())) for name, s in systems.items()}
    ratios = [(a, b) for a, b in RATIOS if a in systems and b in systems]
    header = ["size"]
    for name in systems:
        header += [f"{label(name)} µs", f"{label(name)} GB/s"]
    header += [f"{label(a)}/{label(b)}" for a, b in ratios]
    caption = (
        f"float32 allreduce, world size {WORLD_SIZE}, {info['cpu_model']} "
        f"({info['cores']} cores), {info['date'][:10]}. Time per call in µs (median of "
        f"{report['method']['repeats']} runs, max over ranks); busbw in GB/s as in "
        "nccl-tests; ratios are busbw ratios (> 1: weft is faster)."
    )
    lines = [caption, "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for nbytes in (entry["bytes"] for entry in report["plan"]):
        at = {name: rows[name].get(nbytes) for name in systems}
        cells = [human(nbytes)]
        for row in at.values():
            mark = "" if row is None or row["check_ok"] else " ✗"
            cells.append(fmt(row and row["time_us"]) + mark)
            cells.append(fmt(row and row["busbw_GBps"]))
        for a, b in ratios:
            ratio = at[a] and at[b] and at[a]["busbw_GBps"] / at[b]["busbw_GBps"]
            cells.append(fmt_ratio(ratio) if ratio else "–")
        lines.append("| " + " | ".join(cells) + " |")
    notes = [f"{label(n)}: {s['status']}: {s.get('reason')}" for n, s in systems.items()]
    notes = [note for note, s in zip(notes, systems.values()) if s["status"] != "ok"]
    if any(not r["check_ok"] for by_size in rows.values() for r in by_size.values()):
        notes.append("✗: the result check (allreduce of rank + 1) failed at this size")
    notes.append(noise_note(report))
    lines += [""] + [f"- {note}" for note in notes]
    return "\n".join(lines) + "\n"


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullLocator

    fig, ax = plt.subplots(figsize=(9, 5.5))
    for name, system in report["systems"].items():
        rows = system.get("results")
        if rows:
            sizes, busbw = [r["bytes"] for r in rows], [r["busbw_GBps"] for r in rows]
            line_label = f"{label(name)} ({system['transport']})"
            ax.plot(sizes, busbw, marker="o", markersize=3, label=line_label)
    sizes = [entry["bytes"] for entry in report["plan"]]
    step = max(1, (len(sizes) + 11) // 12)  # about 12 labels, always the first and last
    ticks = sorted({sizes[0], *sizes[::-step]})
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(ticks, [human(s) for s in ticks], rotation=45)
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("message size per rank (float32)")
    ax.set_ylabel("busbw (GB/s, nccl-tests definition)")
    info = report["machine"]
    ax.set_title(
        f"float32 allreduce, world size {WORLD_SIZE}: {info['cpu_model']}, "
        f"{info['cores']} cores ({info['date'][:10]})"
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ----------------------------------------------------------------------------------------


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = p.add_argument
    add("--sizes", type=parse_sizes, help=f"'8,64K,1M' or '8:64M[:x]'; {DEFAULT_SIZES}")
    add("--quick", action="store_true", help=f"smoke test: {QUICK_SIZES}, 1 repeat")
    add("--out-dir", type=Path, help="default bench/results (with --quick: a temp dir)")
    add("--systems", default=",".join(SYSTEMS), help="comma list, default %(default)s")
    add("--repeats", type=int, help="runs of the whole plan per system (default 3)")
    add("--min-iters", type=int, default=10, help="default %(default)s")
    add("--max-iters", type=int, help="default 1000 (with --quick: 100)")
    add("--bytes-per-timing", type=parse_size, default=256 << 20, help="default 256M")
    add("--timeout", type=float, default=300, help="seconds per launch of a system")
    add(
        "--pin",
        choices=("default", "all", "none"),
        default="default",
        help="default: weft and gloo ranks unpinned, OpenMPI bound to cores (its default); "
        "all: rank r on core r everywhere; none: nothing bound",
    )
    args = p.parse_args(argv)
    args.sizes = args.sizes or parse_sizes(QUICK_SIZES if args.quick else DEFAULT_SIZES)
    args.repeats = args.repeats or (1 if args.quick else 3)
    args.max_iters = args.max_iters or (100 if args.quick else 1000)
    if args.out_dir is None:
        quick_dir = Path(tempfile.gettempdir(), "weft-bench-quick")
        args.out_dir = quick_dir if args.quick else BENCH_DIR / "results"
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = set(args.systems) - set(SYSTEMS)
    if unknown:
        p.error(f"unknown systems {sorted(unknown)}; known: {', '.join(SYSTEMS)}")
    args.mpi_library = None
    return args


def describe_method(args: argparse.Namespace) -> dict:
    bounds = f"{args.min_iters}, {args.max_iters}"
    clamp = f"clamp({args.bytes_per_timing} B / size, {bounds})"
    return {
        "world_size": WORLD_SIZE,
        "dtype": "float32",
        "op": "sum, in place",
        "repeats": args.repeats,
        "iterations": f"{clamp}, the same for every system",
        "warmup": "max(2, iterations // 10) untimed calls per size, then a barrier",
        "time_us": "per repeat: max over ranks of elapsed / iterations; reported: the "
        "median over repeats; the repeats of the systems interleaved, order rotating",
        "bandwidth": "GB = 1e9 B; algbw = bytes / time; busbw = algbw * 2(n-1)/n",
        "pin": args.pin,
        "inherited_weft_env": {k: v for k, v in os.environ.items() if k.startswith("WEFT_")},
        "mpirun": " ".join(mpirun_command(args)),
    }


def run_all(args: argparse.Namespace, plan: list[dict], report: dict) -> None:
    """Fills report["systems"]: runs every available system `repeats` times, interleaved."""
    runs: dict[str, list] = {}
    for name in args.systems:
        system = SYSTEMS[name]
        entry = {"status": "ok", "transport": system.transport}
        report["systems"][name] = entry
        try:
            system.check()
            runs[name] = []
        except Skipped as e:
            entry.update(status="skipped", reason=str(e))
            print(f"[bench] {name}: skipped: {e}", file=sys.stderr)

    for repeat in range(args.repeats):
        names = [n for n in runs if report["systems"][n]["status"] == "ok"]
        shift = repeat % max(1, len(names))
        for name in names[shift:] + names[:shift]:
            entry = report["systems"][name]
            t0, stall0 = time.monotonic(), cpu_stall_s()
            try:
                runs[name].append(SYSTEMS[name].launch(plan, args))
            except Exception as e:  # noqa: BLE001 - recorded; the other systems go on
                reason = f"repeat {repeat + 1}: {e}".strip()[-2000:]
                entry.update(status="failed", reason=reason)
                print(f"[bench] {name}: FAILED: {reason}", file=sys.stderr)
                continue
            took = time.monotonic() - t0
            waited = round((cpu_stall_s() - stall0) / took, 3)
            entry.setdefault("cpu_wait_fraction", []).append(waited)
            print(
                f"[bench] {name}: repeat {repeat + 1}/{args.repeats}: {took:.1f} s, "
                f"tasks waited for a CPU {waited:.0%} of it",
                file=sys.stderr,
            )

    for name, system_runs in runs.items():
        if system_runs:  # a system that failed late keeps its completed repeats
            report["systems"][name]["repeats_done"] = len(system_runs)
            report["systems"][name]["results"] = summarize(plan, system_runs)


def main(argv=None) -> None:
    args = parse_args(argv)
    plan = make_plan(args.sizes, args)
    started = time.monotonic()
    report = {
        "machine": machine_info(),
        "method": describe_method(args),
        "plan": plan,
        "load_average_start": load_average(),
        "cpu_busy_before_start": cpu_busy(),
        "systems": {},
    }
    run_all(args, plan, report)
    report["load_average_end"] = load_average()
    report["duration_s"] = round(time.monotonic() - started, 1)
    if args.mpi_library:
        report["machine"]["mpi_library"] = args.mpi_library

    args.out_dir.mkdir(parents=True, exist_ok=True)
    stem = args.out_dir / f"allreduce_ws{WORLD_SIZE}"
    table = markdown_table(report)
    Path(f"{stem}.json").write_text(json.dumps(report, indent=1) + "\n")
    Path(f"{stem}.md").write_text(table)
    plot(report, Path(f"{stem}.png"))
    print(table)
    took = report["duration_s"]
    print(f"[bench] wrote {stem}.json, .md, .png; took {took:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
