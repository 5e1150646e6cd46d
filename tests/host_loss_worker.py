"""One rank of test_failure_host.py, started inside a network namespace "host": it runs its
case's operations until one fails, printing "looping" once it got going, then one JSON line
(weft_proc.outcome: what was raised, with the wall-clock time).

Cases: "small" allreduces of 8 bytes; "large" allreduces of 64 MiB, so that data is in flight;
"recv", where rank 0 receives 4 KiB messages that rank 2 sends (the other ranks idle);
"late_recv", where rank 0 sends 64 MiB to rank 2, which posts its receive only after
--late seconds (the other ranks idle), once: a slow receiver is no lost host.
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import timedelta

import numpy as np
import torch.distributed as dist
import weft
from weft_proc import outcome

LOOP_S = 120  # a case whose failure never comes ends here, and the test sees no error
IDLE_RANKS = {"recv": (1, 3), "late_recv": (1, 3)}


def late_recv(comm, rank: int, late_s: float) -> float:
    """Rank 0 sends 64 MiB to rank 2, which waits ``late_s`` before it receives; returns the
    sum of what arrived."""
    buf = np.ones(16 << 20, np.float32)
    if rank == 0:
        comm.send(buf, 2)
        return float(buf.sum())
    time.sleep(late_s)
    buf[:] = 0
    comm.recv(buf, 0)
    return float(buf.sum())


def run(comm, case: str, rank: int) -> None:
    count = {"small": 2, "large": 16 << 20, "recv": 1024}[case]
    buf = np.ones(count, np.float32)
    done = 0
    deadline = time.monotonic() + LOOP_S
    while time.monotonic() < deadline:
        if case == "recv" and rank == 0:
            comm.recv(buf, 2)
        elif case == "recv":
            comm.send(buf, 0)
        else:
            comm.allreduce(buf)
        done += 1
        if done == 3:
            print("looping", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--size", type=int, required=True)
    parser.add_argument("--store", required=True, help="ip:port of rank 0's TCPStore")
    parser.add_argument("--case", required=True, choices=("small", "large", "recv", "late_recv"))
    parser.add_argument("--timeout", type=float, required=True)
    parser.add_argument("--late", type=float, default=0.0, help="late_recv: seconds to wait")
    args = parser.parse_args()
    ip, port = args.store.split(":")
    store = dist.TCPStore(
        ip, int(port), args.size, args.rank == 0, timedelta(seconds=60), wait_for_workers=False
    )
    comm = weft.Communicator(store, args.rank, args.size, name=args.case, timeout=args.timeout)
    if args.rank in IDLE_RANKS.get(args.case, ()):
        print("looping", flush=True)
        time.sleep(LOOP_S)
        return
    if args.case == "late_recv":
        print("looping", flush=True)
        print(json.dumps(outcome(lambda: late_recv(comm, args.rank, args.late))), flush=True)
        return
    print(json.dumps(outcome(lambda: run(comm, args.case, args.rank))), flush=True)


if __name__ == "__main__":
    main()
