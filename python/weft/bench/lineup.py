"""Which systems a run measures: the weft variants (--algo x --transport) and the peers of
--vs, each either ready or skipped with the reason."""

from __future__ import annotations

import importlib.util
import shutil
from dataclasses import dataclass, field

from weft.bench.launch import Launcher
from weft.bench.ops import OPS

PEERS = ("gloo", "mpi", "mpi-tcp", "nccl")
# Peers that are another peer held to one transport: (kind, environment of its launch).
# mpi-tcp is OpenMPI over its tcp component alone (ob1 messaging, no shared memory), the
# like-for-like peer of weft over tcp.
PEER_VARIANTS = {"mpi-tcp": ("mpi", {"OMPI_MCA_pml": "ob1", "OMPI_MCA_btl": "tcp,self"})}
TRANSPORTS = ("shm", "tcp")
# Asked for by name only ('all' leaves them out): they need libfabric or libibverbs and an RDMA
# device (docs/rdma.md).
RDMA_TRANSPORTS = ("ofi", "ibverbs")


@dataclass
class Entry:
    name: str  # as tables, JSON and the plot show it
    kind: str  # weft, gloo, mpi or nccl
    ops: list[str]
    env: dict[str, str] = field(default_factory=dict)
    status: str = "ok"  # ok, skipped or failed
    reason: str | None = None
    info: dict = field(default_factory=dict)  # what the launch reported (e.g. MPI's library)
    plan: dict | None = None  # an Algorithm file to run: path, format, name
    channels: int = 0  # the communicator's connection sets per peer (0: WEFT_CHANNELS)

    def describe(self) -> dict:
        """The entry as the JSON "systems" list has it."""
        return {
            "name": self.name,
            "kind": self.kind,
            "env": self.env,
            "status": self.status,
            "reason": self.reason,
            **self.info,
        }


def weft_entries(
    algos: list[str],
    transports: list[str],
    ops: list[str],
    hosts: int = 1,
    channels: list[int] | None = None,
) -> list[Entry]:
    """One entry per (algorithm, transport). With --algo all, every algorithm weft has for
    the ops asked on ranks spread over `hosts` hosts, each measured on the ops it applies to;
    a named algorithm runs every op, and weft refuses the ops it does not apply to (reported
    with weft's message). Each of `channels` (connection sets per peer) makes a variant of
    its own, named with it."""
    import weft

    def families(op: str) -> list[str]:
        return weft.algorithms(OPS[op].collective, hosts)

    every = algos == ["all"]
    if every:
        algos = list(dict.fromkeys(a for op in ops for a in families(op)))
    entries = []
    for algo in algos:
        applies = [op for op in ops if algo in families(op)]
        runs = applies if every else ops
        for transport in transports:
            for n in channels or [0]:
                name = "weft" + ("" if transport == "auto" else f"-{transport}")
                tags = [] if algo == "auto" else [algo]
                tags += [f"{n}ch"] if n else []
                name += f"[{','.join(tags)}]" if tags else ""
                env = {"WEFT_ALGO": algo, "WEFT_TRANSPORT": transport}
                entries.append(Entry(name, "weft", runs, env, channels=n))
    return entries


def algorithm_files(plans: list, msccls: list, root: int | None = None) -> list[dict]:
    """--plan and --msccl files, loaded (and so parsed strictly) here once: a broken file is
    one clear error before anything launches. ``root``: -r where given, which a broadcast's or
    reduce's file must be for (see load_algorithm)."""
    from weft import topo

    files = []
    for paths, fmt in ((plans, "json"), (msccls, "msccl")):
        for path in paths:
            try:
                algo = load_algorithm(path, fmt, root)
            except (OSError, topo.AlgorithmError) as e:
                raise SystemExit(f"weft-bench: {path}: {e}") from e
            files.append(
                {
                    "path": str(path),
                    "format": fmt,
                    "name": algo.name,
                    "algo": algo,
                    # The root a worker loads an MSCCL file with (None: it has none).
                    "root": algo.root if fmt == "msccl" and rooted(algo) else None,
                }
            )
    return files


def load_algorithm(path, fmt: str, root: int | None):
    """An Algorithm file (``fmt`` json or msccl) for a run whose -r is ``root`` (None: not
    given). A broadcast's or reduce's file is for one root: given -r, it must be that one (an
    in-place MSCCL reduce that several ranks write is loaded with it); without, the file's is
    the run's (``run_root``)."""
    from weft import topo
    from weft.topo.msccl import AmbiguousRoot

    try:
        algo = topo.load_msccl(path) if fmt == "msccl" else topo.load(path)
    except AmbiguousRoot as e:
        if root is None:
            raise topo.AlgorithmError(f"{e} (-r R)") from None
        return topo.load_msccl(path, root=root)
    if root is not None and rooted(algo) and algo.root != root:
        raise topo.AlgorithmError(
            f"{algo.name} is for root {algo.root}, but -r {root} was given: leave out -r to "
            f"measure at the file's root"
        )
    return algo


def rooted(algo) -> bool:
    """Whether the Algorithm's op has a root (broadcast, reduce)."""
    return any(op.rooted and op.collective == algo.collective for op in OPS.values())


def run_root(given: int | None, files: list[dict]) -> int:
    """The root the run measures broadcast and reduce at, for every system alike: -r where
    given (the files were loaded for it), else the root of the broadcast's or reduce's files,
    else 0."""
    if given is not None:
        return given
    roots = {f["path"]: f["algo"].root for f in files if rooted(f["algo"])}
    if len(set(roots.values())) > 1:
        listed = ", ".join(f"{path} root {root}" for path, root in roots.items())
        raise SystemExit(
            f"weft-bench: the algorithm files are for different roots ({listed}), and a run "
            "measures one: measure them in separate runs"
        )
    return next(iter(roots.values()), 0)


def ranks_of(files: list[dict]) -> int | None:
    """The rank count the files are for (--np's default with them), the same for all."""
    counts = {f["algo"].ranks for f in files}
    if len(counts) > 1:
        raise SystemExit(
            f"weft-bench: the algorithm files are for {sorted(counts)} ranks: pick one"
        )
    return counts.pop() if counts else None


def algorithm_entries(files: list[dict], transports: list[str], ranks: int) -> list[Entry]:
    """One weft entry per (file, transport), measured on the op its collective is."""
    by_collective = {op.collective: name for name, op in OPS.items()}
    entries = []
    for f in files:
        algo = f["algo"]
        for transport in transports:
            name = (
                f"weft{'' if transport == 'auto' else f'-{transport}'}[{f['format']}:{algo.name}]"
            )
            env = {"WEFT_ALGO": "auto", "WEFT_TRANSPORT": transport}
            spec = {k: f[k] for k in ("path", "format", "name", "root")}
            entry = Entry(name, "weft", [by_collective[algo.collective]], env, plan=spec)
            if algo.ranks != ranks:
                entry.status = "skipped"
                entry.reason = f"{algo.name} is for {algo.ranks} ranks, the run has {ranks}"
            entries.append(entry)
    return entries


def peer_entry(peer: str, ops: list[str], ranks: int, launcher: Launcher | None, mpirun: str):
    kind, env = PEER_VARIANTS.get(peer, (peer, {}))
    entry = Entry(peer, kind, ops, dict(env))
    entry.reason = unavailable(kind, ranks, launcher, mpirun)
    if not entry.reason and env and launcher is not None:
        entry.reason = f"{peer} sets its launch's environment; run it without a launcher"
    if entry.reason:
        entry.status = "skipped"
    return entry


def unavailable(peer: str, ranks: int, launcher: Launcher | None, mpirun: str) -> str | None:
    """Why the peer of kind `peer` cannot run here, or None."""
    import torch
    import torch.distributed as dist

    if peer == "gloo":
        if not dist.is_available() or not dist.is_gloo_available():
            return "this torch has no gloo backend"
    elif peer == "mpi":
        if importlib.util.find_spec("mpi4py") is None:
            return "mpi4py is not installed (pip install mpi4py)"
        if launcher is None and shutil.which(mpirun) is None:
            return f"{mpirun} not found (apt-get install openmpi-bin, or --mpirun PATH)"
        if launcher is not None and launcher.name != "mpirun":
            return f"MPI ranks must be started by mpirun, not {launcher.name}"
    elif peer == "nccl":
        if not torch.cuda.is_available():
            return "no CUDA device (torch.cuda.is_available() is False)"
        if not dist.is_nccl_available():
            return "this torch has no NCCL"
        if launcher is None and torch.cuda.device_count() < ranks:
            return f"{ranks} ranks need {ranks} GPUs, found {torch.cuda.device_count()}"
    return None
