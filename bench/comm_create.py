"""What a choosing communicator's start-up costs: creating a weft.Communicator that measures
its cost model and times the rival families' Plans (the default), against one with a forced
family (WEFT_ALGO=ring), which times nothing.

    python bench/comm_create.py [--worlds 4:shm,4:tcp,8:tcp] [--launches 5]

Each launch starts the ranks afresh; every rank first makes an untimed communicator (so the
store and the processes are warm), then times the creation of the one under test. A launch's
figure is the slowest rank's; the table gives the median over launches, and what the choosing
communicator then runs for an allreduce at a few sizes. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import weft
import weft.local

SIZES = (64, 4096, 65536, 512 << 10)


def rank_main(rank, size, store, arg):
    transport, algo = arg
    os.environ["WEFT_TRANSPORT"] = transport
    forced = {} if algo == "auto" else {"algo": algo}
    weft.Communicator(store, rank, size, name="warm", timeout=60, algo="ring").barrier()
    start = time.perf_counter()
    comm = weft.Communicator(store, rank, size, name="timed", timeout=60, **forced)
    seconds = time.perf_counter() - start
    comm.barrier()
    return seconds, [comm.algorithm("allreduce", b)[0] for b in SIZES]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worlds", default="4:shm,4:tcp,8:tcp", help="ranks:transport, ...")
    parser.add_argument("--launches", type=int, default=5)
    args = parser.parse_args()
    print(
        "| ranks | transport | ring (ms) | auto (ms) | auto - ring | auto's allreduce at "
        + ", ".join(f"{b} B" for b in SIZES)
        + " |"
    )
    print("|---|---|---|---|---|---|")
    for world in args.worlds.split(","):
        ranks, transport = world.split(":")
        medians, choices = {}, []
        for algo in ("ring", "auto"):
            launches = []
            for _ in range(args.launches):
                results = weft.local.spawn(rank_main, int(ranks), (transport, algo))
                launches.append(max(seconds for seconds, _ in results))
                if algo == "auto":
                    choices = results[0][1]  # the last launch's
            medians[algo] = 1000 * statistics.median(launches)
        print(
            f"| {ranks} | {transport} | {medians['ring']:.1f} | {medians['auto']:.1f} | "
            f"{medians['auto'] - medians['ring']:.1f} | {', '.join(choices)} |"
        )


if __name__ == "__main__":
    main()
