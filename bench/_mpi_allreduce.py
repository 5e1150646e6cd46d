"""OpenMPI side of allreduce_vs_peers.py: run under mpirun, one process per rank.

    mpirun -np 2 python bench/_mpi_allreduce.py PLAN.json OUT.json

PLAN.json is the list of {bytes, iterations, warmup}; rank 0 writes OUT.json with every rank's
elapsed seconds per size and the MPI library version.
"""

from __future__ import annotations

import json
import sys

from _timing import Collective, time_sizes
from mpi4py import MPI


def main() -> None:
    plan_path, out_path = sys.argv[1], sys.argv[2]
    with open(plan_path) as f:
        plan = json.load(f)
    comm = MPI.COMM_WORLD
    coll = Collective(
        allreduce=lambda buf: comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM),
        barrier=comm.Barrier,
    )
    per_rank = comm.gather(time_sizes(coll, comm.rank, comm.size, plan), root=0)
    if comm.rank == 0:
        library = MPI.Get_library_version().strip().splitlines()[0]
        with open(out_path, "w") as f:
            json.dump({"per_rank": per_rank, "library": library}, f)


if __name__ == "__main__":
    main()
