"""One MPI rank of weft-bench, started by mpirun (launch.run_mpirun):

    mpirun -np N python -m weft.bench.mpi_rank JOB.json OUT.json

Rank 0 writes every rank's measurements (name -> run_plan's output) and the MPI library's
version to OUT.json.
"""

from __future__ import annotations

import json
import sys

from mpi4py import MPI

from weft.bench.progress import step_writer
from weft.bench.systems import Mpi
from weft.bench.timing import run_plan


def main(job_path: str, out_path: str) -> None:
    with open(job_path) as f:
        job = json.load(f)
    comm = MPI.COMM_WORLD
    step = step_writer(job["progress"] if comm.rank == 0 else None)
    (variant,) = job["variants"]
    variants = {variant["name"]: (Mpi(), variant["ops"])}
    out = run_plan(variants, job["plan"], comm.rank, comm.size, step)
    per_rank = comm.gather(out, root=0)
    if comm.rank == 0:
        library = MPI.Get_library_version().strip().splitlines()[0].strip("\0 ")
        with open(out_path, "w") as f:
            json.dump({"per_rank": per_rank, "library": library}, f)


if __name__ == "__main__":
    main(*sys.argv[1:3])
