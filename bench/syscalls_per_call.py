"""System calls per allreduce and rank, counted with strace, for each transport.

    FI_PROVIDER=tcp python bench/syscalls_per_call.py [--transports ofi,tcp] [--np 4]
        [--bytes 1048576] [--calls 400]

Each transport runs a forced ring (`WEFT_ALGO=ring WEFT_TUNE=off`) on `--np` local ranks
twice under `strace -f -c`: 10 calls, then 10 + `--calls`; the difference over `--calls` and
the ranks is what one call costs a rank, without the start (imports, connecting). strace slows
every call, so only the counts mean anything, not the times. Prints a Markdown table of the
calls that come to at least 0.5 a call.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

WARM_CALLS = 10


def rank_main(rank, size, store, nbytes, calls):
    import numpy as np
    import weft

    comm = weft.Communicator(store, rank, size)
    buf = np.zeros(nbytes // 4, np.float32)
    for _ in range(calls):
        comm.allreduce(buf)
    comm.barrier()
    return 0


def run_ranks(transport: str, ranks: int, nbytes: int, calls: int) -> None:
    import weft.local

    env = {"WEFT_TRANSPORT": transport, "WEFT_ALGO": "ring", "WEFT_TUNE": "off"}
    weft.local.spawn(rank_main, ranks, nbytes, calls, env=env)


def strace_counts(transport: str, ranks: int, nbytes: int, calls: int) -> dict[str, int]:
    """Calls per system call over a whole launch (every process and thread)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp, "strace.txt")
        cmd = ["strace", "-f", "-c", "-o", str(out), sys.executable, __file__, "--rank-launch"]
        cmd += [transport, str(ranks), str(nbytes), str(calls)]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, timeout=600)
        counts = {}
        for line in out.read_text().splitlines():
            fields = line.split()
            # "% time  seconds  usecs/call  calls  [errors]  syscall"
            if len(fields) >= 5 and fields[0][0].isdigit() and fields[-1] != "total":
                counts[fields[-1]] = int(fields[3])
        return counts


def main() -> None:
    if len(sys.argv) == 6 and sys.argv[1] == "--rank-launch":
        transport, ranks, nbytes, calls = sys.argv[2], *map(int, sys.argv[3:])
        run_ranks(transport, ranks, nbytes, calls)
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--transports", default="ofi,tcp")
    parser.add_argument("--np", type=int, default=4)
    parser.add_argument("--bytes", type=int, default=1 << 20)
    parser.add_argument("--calls", type=int, default=400)
    args = parser.parse_args()
    if shutil.which("strace") is None:
        sys.exit("syscalls_per_call.py needs strace (apt-get install strace)")
    per_call = {}
    for transport in args.transports.split(","):
        base = strace_counts(transport, args.np, args.bytes, WARM_CALLS)
        more = strace_counts(transport, args.np, args.bytes, WARM_CALLS + args.calls)
        per_call[transport] = {
            name: max(0.0, (more[name] - base.get(name, 0)) / args.calls / args.np) for name in more
        }
    names = sorted(
        {n for calls in per_call.values() for n, v in calls.items() if v >= 0.5},
        key=lambda n: -max(calls.get(n, 0) for calls in per_call.values()),
    )
    print(f"{args.bytes}-byte ring allreduce on {args.np} ranks: system calls per call and rank")
    print()
    print("| system call | " + " | ".join(per_call) + " |")
    print("|---|" + "---:|" * len(per_call))
    for name in names:
        cells = " | ".join(f"{c.get(name, 0):.1f}" for c in per_call.values())
        print(f"| {name} | {cells} |")
    totals = " | ".join(f"{sum(c.values()):.1f}" for c in per_call.values())
    print(f"| all | {totals} |")


if __name__ == "__main__":
    main()
