"""The writes weft's RDMA protocol posts per allreduce, counted, over either back end.

    FI_PROVIDER=tcp python bench/rdma_writes.py [--bytes 4096,1048576,16777216] [--calls 10]
    WEFT_IBVERBS_LIB=PATH python bench/rdma_writes.py --transport ibverbs

`--transport ibverbs` counts over the ibverbs back end: on a NIC, or over the tests' verbs
emulator (`WEFT_IBVERBS_LIB` naming its library, which `tests/rdma_support.py` builds). The
protocol is the same code over both, so the counts agree where the ranks take the same turns.

Two ranks, a forced ring (`WEFT_ALGO=ring WEFT_TUNE=off`), the default slots (1 MiB x 4).
Each row is rank 0's mean per call over `--calls` calls of `weft._C.rdma_writes()`: messages
it sent (eager, or rendezvous: a ready-to-send header), the clear-to-send entries it wrote for
its peer's rendezvous messages (early ones before the message arrived, and how many of those
an eager message left unused), payload and credit writes. Prints a Markdown table.
"""

from __future__ import annotations

import argparse

import numpy as np
import weft
import weft.local

COLUMNS = (
    ("messages sent", lambda d: d["eager"] + d["ready_to_send"]),
    ("eager", lambda d: d["eager"]),
    ("rendezvous", lambda d: d["ready_to_send"]),
    ("clear-to-send written", lambda d: d["clear_to_send"]),
    ("of them early", lambda d: d["early_clear_to_send"]),
    ("early, unused", lambda d: d["unused_clear_to_send"]),
    ("credits", lambda d: d["credit"]),
    ("writes in all", lambda d: sum(d[k] for k in WRITE_KINDS)),
)
WRITE_KINDS = ("eager", "ready_to_send", "clear_to_send", "payload", "credit")


def rank_main(rank, size, store, nbytes, calls):
    comm = weft.Communicator(store, rank, size)
    buf = np.zeros(nbytes // 4, np.float32)
    comm.allreduce(buf)  # connections warm, registrations cached
    comm.barrier()
    before = weft._C.rdma_writes()
    for _ in range(calls):
        comm.allreduce(buf)
    after = weft._C.rdma_writes()
    comm.barrier()
    return {k: (after[k] - before[k]) / calls for k in after}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bytes", default="4096,1048576,16777216", help="comma-separated sizes")
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--transport", choices=("ofi", "ibverbs"), default="ofi")
    args = parser.parse_args()
    env = {"WEFT_TRANSPORT": args.transport, "WEFT_ALGO": "ring", "WEFT_TUNE": "off"}
    print("| allreduce (bytes) | " + " | ".join(name for name, _ in COLUMNS) + " |")
    print("|---" * (len(COLUMNS) + 1) + "|")
    for nbytes in (int(b) for b in args.bytes.split(",")):
        counts = weft.local.spawn(rank_main, 2, nbytes, args.calls, env=env)[0]
        cells = " | ".join(f"{value(counts):g}" for _, value in COLUMNS)
        print(f"| {nbytes} | {cells} |")


if __name__ == "__main__":
    main()
