"""In-place against out-of-place allreduce on 2 ranks over shared memory, one family forced.

    python bench/in_place_ws2.py [--bytes 8,65536,262144] [--calls 20000] [--blocks 5]

Both ranks hold one communicator per family (oneshot, rd, ring) and run blocks of back-to-back
calls in turns: in place (what `dist.all_reduce` does) and out of place for oneshot, in place
for rd and the ring, so that every form meets the same placement of ranks on CPUs and the same
background load. A block's figure is its mean call on rank 0; the table gives the median over
`--blocks` blocks, in µs. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import weft
import weft.local

# (label, family, in place)
FORMS = (
    ("oneshot in place", "oneshot", True),
    ("oneshot out of place", "oneshot", False),
    ("rd in place", "rd", True),
    ("ring in place", "ring", True),
)
WARMUP_CALLS = 1000


def rank_main(rank, size, store, nbytes, calls, blocks):
    comms = {
        f: weft.Communicator(store, rank, size, name=f, algo=f) for f in ("oneshot", "rd", "ring")
    }
    data = np.zeros(nbytes // 4, dtype=np.float32)  # stays finite however often it is summed
    out = np.empty_like(data)
    figures = {label: [] for label, _, _ in FORMS}
    for _ in range(blocks):
        for label, family, in_place in FORMS:
            comm, target = comms[family], None if in_place else out
            for _ in range(WARMUP_CALLS):
                comm.allreduce(data, out=target)
            comm.barrier()
            start = time.perf_counter()
            for _ in range(calls):
                comm.allreduce(data, out=target)
            figures[label].append((time.perf_counter() - start) / calls * 1e6)
            comm.barrier()
    return {label: statistics.median(values) for label, values in figures.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bytes", default="8,65536,262144", help="comma-separated sizes")
    parser.add_argument("--calls", type=int, default=20000, help="calls per block at 8 B")
    parser.add_argument("--blocks", type=int, default=5)
    args = parser.parse_args()
    print("| bytes | " + " | ".join(label for label, _, _ in FORMS) + " |")
    print("|---" * (len(FORMS) + 1) + "|")
    for nbytes in (int(b) for b in args.bytes.split(",")):
        # Fewer calls for larger sizes: a block of about the same length in time.
        calls = max(200, args.calls // max(1, nbytes // 4096))
        medians = weft.local.spawn(
            rank_main, 2, nbytes, calls, args.blocks, env={"WEFT_TRANSPORT": "shm"}
        )[0]
        print(
            f"| {nbytes} | " + " | ".join(f"{medians[label]:.2f}" for label, _, _ in FORMS) + " |"
        )


if __name__ == "__main__":
    main()
