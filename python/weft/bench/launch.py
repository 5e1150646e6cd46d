"""Getting ranks: launched here (local processes, or mpirun for MPI), or given by an outside
launcher (torchrun, srun, mpirun) whose environment names this process's rank."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from weft import local
from weft.bench import systems
from weft.bench.progress import step_writer
from weft.bench.timing import run_plan


@dataclass
class Launcher:
    """An outside launcher's view of this process."""

    name: str
    rank: int
    size: int
    local_rank: int


def detect() -> Launcher | None:
    """torchrun, srun or mpirun from their environment variables; None when run by hand."""
    env = os.environ
    if "RANK" in env and "WORLD_SIZE" in env:
        name = "torchrun" if "TORCHELASTIC_RUN_ID" in env else "env"
        return Launcher(name, int(env["RANK"]), int(env["WORLD_SIZE"]), local_rank("LOCAL_RANK"))
    if "SLURM_PROCID" in env and "SLURM_STEP_NUM_TASKS" in env:  # srun (not the batch script)
        size = int(env["SLURM_STEP_NUM_TASKS"])
        return Launcher("srun", int(env["SLURM_PROCID"]), size, local_rank("SLURM_LOCALID"))
    if "OMPI_COMM_WORLD_RANK" in env:
        size = int(env["OMPI_COMM_WORLD_SIZE"])
        rank, local = int(env["OMPI_COMM_WORLD_RANK"]), "OMPI_COMM_WORLD_LOCAL_RANK"
        return Launcher("mpirun", rank, size, local_rank(local))
    return None


def local_rank(var: str) -> int:
    return int(os.environ.get(var, "0"))


def rendezvous(launcher: Launcher):
    """The launcher's store: torchrun's own, or one at MASTER_ADDR:MASTER_PORT (default
    127.0.0.1:29500) that rank 0 hosts."""
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    os.environ.setdefault("RANK", str(launcher.rank))
    os.environ.setdefault("WORLD_SIZE", str(launcher.size))
    store, _, _ = next(dist.rendezvous("env://"))
    return store


def count_hosts(store, launcher: Launcher, timeout_s: float = 60) -> int:
    """How many hosts the launcher's ranks are on, as weft tells hosts apart (WEFT_HOST_ID)."""
    import weft

    store.set(f"bench/host/{launcher.rank}", weft.host_id())
    keys = [f"bench/host/{r}" for r in range(launcher.size)]
    store.wait(keys, timedelta(seconds=timeout_s))
    return len({store.get(key) for key in keys})


# ---- ranks launched here --------------------------------------------------------------------


def rank_main(rank: int, size: int, store, job: dict) -> dict:
    """One spawned rank (weft.local.spawn): the plan over the launch's variants."""
    return run_variants(job, rank, size, store, rank)


def run_variants(job: dict, rank: int, size: int, store, local_rank: int) -> dict:
    """run_plan over a system per variant of `job` (each weft algorithm its communicator)."""
    variants = {
        v["name"]: (
            systems.create(
                job["kind"],
                rank,
                size,
                store,
                local_rank,
                v["algo"],
                v.get("plan"),
                v.get("channels"),
            ),
            v["ops"],
        )
        for v in job["variants"]
    }
    step = step_writer(job["progress"] if rank == 0 else None)
    out = run_plan(variants, job["plan"], rank, size, step)
    for system, _ in variants.values():
        system.close()
    return out


def run_local(kind: str, env: dict, job: dict, size: int, timeout: float, mpirun: str) -> dict:
    """Runs `job` on `size` fresh local ranks; returns {"per_rank": [...], "library": ...}."""
    job = {**job, "kind": kind}
    if kind == "mpi":
        return run_mpirun(job, size, timeout, mpirun, env)
    per_rank = local.spawn(rank_main, size, job, env=env, timeout=timeout)
    return {"per_rank": per_rank}


def mpirun_command(mpirun: str, size: int) -> list[str]:
    # OpenMPI refuses root without --allow-run-as-root, and more ranks than cores without
    # --oversubscribe. Placement is left at OpenMPI's default, as its users run it.
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    return [mpirun, *root, "--oversubscribe", "-np", str(size)]


def run_mpirun(job: dict, size: int, timeout: float, mpirun: str, env: dict) -> dict:
    with tempfile.TemporaryDirectory(prefix="weft-bench-mpi-") as tmp:
        job_path, out_path = Path(tmp, "job.json"), Path(tmp, "out.json")
        job_path.write_text(json.dumps(job))
        worker = [sys.executable, "-m", "weft.bench.mpi_rank", str(job_path), str(out_path)]
        run_bounded(mpirun_command(mpirun, size) + worker, timeout, {**os.environ, **env})
        return json.loads(out_path.read_text())


def run_bounded(cmd: list[str], timeout: float, env: dict | None = None) -> None:
    """Runs cmd in its own process group; kills the whole group on timeout."""
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env=env,
    )
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise TimeoutError(f"{cmd[0]} still running after {timeout:.0f} s") from None
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{output[-3000:]}")


# ---- ranks given by an outside launcher -----------------------------------------------------


def run_in_process(kind: str, job: dict, launcher: Launcher, store, key: str) -> dict | None:
    """Runs `job` over one system in this process; rank 0 gets every rank's output (through
    the store), the other ranks None."""
    import torch.distributed as dist

    rank, size = launcher.rank, launcher.size
    scoped = dist.PrefixStore(key, store)
    out = run_variants({**job, "kind": kind}, rank, size, scoped, launcher.local_rank)
    scoped.set(f"out/{rank}", json.dumps(out))
    if rank != 0:
        return None
    return {"per_rank": [json.loads(scoped.get(f"out/{r}")) for r in range(size)]}
