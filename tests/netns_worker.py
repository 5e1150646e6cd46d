"""One rank of the multi-host tests: started inside a network namespace by test_multihost.py.

Runs allreduce with each requested algorithm over counts and dtypes, checks every result
against numpy, and prints one JSON line: errors found, the algorithm each communicator would
run for 64 MiB, and the transport to every peer. With ``--torch-cases`` it also runs those
cases of test_backend.py (every dtype and op of each collective, through torch.distributed
over weft and over gloo on the same inputs) and reports where the two differ.
"""

from __future__ import annotations

import argparse
import json
from datetime import timedelta
from types import SimpleNamespace

import numpy as np
import torch.distributed as dist
import weft

COUNTS = (0, 1, 5, 4099, 65537, 1 << 20)
CASES = (("float32", "sum"), ("int64", "max"), ("float64", "avg"))


def contribution(rank: int, count: int, dtype: str) -> np.ndarray:
    """Small integers, so float sums are exact."""
    return ((np.arange(count) * 7 + rank * 13) % 11 - 5).astype(dtype)


def expected(size: int, count: int, dtype: str, op: str) -> np.ndarray:
    stacked = np.stack([contribution(r, count, dtype) for r in range(size)])
    if op == "max":
        return stacked.max(axis=0)
    total = stacked.sum(axis=0)
    return total / size if op == "avg" else total


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--size", type=int, required=True)
    parser.add_argument("--store", required=True, help="ip:port of rank 0's TCPStore")
    parser.add_argument("--algos", required=True, help="comma-separated WEFT_ALGO values")
    parser.add_argument("--torch-cases", default="", help="comma-separated test_backend cases")
    args = parser.parse_args()
    ip, port = args.store.split(":")
    store = dist.TCPStore(
        ip, int(port), args.size, args.rank == 0, timedelta(seconds=60), wait_for_workers=False
    )
    report = {"rank": args.rank, "errors": [], "chosen": {}, "tcp_beta_s_per_b": []}
    for algo in args.algos.split(","):
        comm = weft.Communicator(
            store, args.rank, args.size, name=f"multihost-{algo}", timeout=60, algo=algo
        )
        report["chosen"][algo] = comm.algorithm("allreduce", 64 << 20)[0]
        report["transports"] = [comm.transport_to(p) for p in range(args.size)]
        report["tcp_beta_s_per_b"].append(comm.cost_model.tcp.beta_s_per_b)
        for count in COUNTS:
            for dtype, op in CASES:
                buf = contribution(args.rank, count, dtype)
                comm.allreduce(buf, op=op)
                if not np.allclose(buf, expected(args.size, count, dtype, op), rtol=1e-12):
                    report["errors"].append(f"{algo} {dtype} {op} count={count}")
    if args.torch_cases:
        import test_backend  # the cases compare weft with gloo (weft_torch.Twins)

        checked = []
        ctx = SimpleNamespace(rank=args.rank, size=args.size, store=store, note=checked.append)
        for case in args.torch_cases.split(","):
            report["errors"] += getattr(test_backend, f"case_{case}")(ctx)
        report["torch_checks"] = len(checked)
        # gloo's worker threads let go of tensors as their work ends; a thread that does so
        # while the interpreter exits is killed taking the GIL, and the process aborts. The
        # groups are torn down first, once every rank is done with them.
        dist.barrier()
        dist.destroy_process_group()
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
