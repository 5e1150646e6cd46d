"""The systems weft-bench compares, as seen from inside one rank.

Each adapter turns (op, form, input, output) into a zero-argument call with the op's NCCL
semantics, so that the one timing loop (timing.py) drives every system alike. A form a system's
API does not offer raises Unsupported; `refusals` are the errors a system raises, on every rank
alike and before any byte moves, for an op it will not run (weft: a WEFT_ALGO that does not
apply to the op).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Call = Callable[[], object]


class Unsupported(Exception):
    """This system's API has no such form of the op."""


class System:
    label = "?"
    device = "cpu"
    refusals: tuple[type[BaseException], ...] = ()

    def bind(self, op: str, in_place: bool, inp, out, root: int) -> Call:
        make = self.calls(root).get((op, in_place))
        if make is None:
            form = "in-place" if in_place else "out-of-place"
            raise Unsupported(f"{self.label} has no {form} {op}")
        return make(inp, out)

    def calls(self, root: int) -> dict[tuple[str, bool], Callable[..., Call]]:
        """(op, in_place) -> (input, output) -> the call."""
        raise NotImplementedError

    def barrier(self) -> None:
        raise NotImplementedError

    def sync(self) -> None:
        """Waits until the calls issued so far are done (device streams)."""

    def algorithm(self, op: str, block_bytes: int, in_place: bool) -> str | None:
        """The algorithm this system runs `op` with at `block_bytes` per rank block, in place
        or not, where it says."""
        return None

    def buffering(self) -> dict:
        """What the system's connections hold, where it says (weft: the largest message and a
        Plan step's budget, which a simulation of its Plans needs; docs/benchmark.md)."""
        return {}

    def trying(self, op: str, block_bytes: int, in_place: bool) -> bool:
        """Whether the next calls of `op` at `block_bytes`, in place or not, are still the
        system's own trials of algorithms (weft's tuner tries families on its first calls at
        each size, in place and out of place apart)."""
        return False

    def close(self) -> None:
        pass


def weft_buffering(comm) -> dict:
    """A communicator's messages (at most slice_bytes) and step budget (step_bytes: half of
    what a connection holds in flight), as it agreed on them with its peers."""
    return {"slice_bytes": comm.topology.slice_bytes, "step_bytes": comm.topology.step_bytes}


class Weft(System):
    label = "weft"

    def __init__(self, rank: int, size: int, store, algo: str, channels: int = 0):
        """`algo`: the family this communicator forces, or auto; `channels`: its connection
        sets per peer (0: WEFT_CHANNELS)."""
        import weft

        self.algo = algo
        self.comm = weft.Communicator(
            store,
            rank,
            size,
            name=f"bench-{self.algo}-{channels}",
            algo=self.algo,
            channels=channels,
        )
        self.refusals = (weft.InvalidArgument,)
        self.hosts = self.comm.topology.hosts

    def bind(self, op, in_place, inp, out, root):
        """weft runs a forced family only where it has one; the benchmark refuses the rest
        rather than label another algorithm's figures with its name."""
        import weft
        from weft.bench.ops import OPS

        collective = OPS[op].collective
        if self.algo != "auto" and self.algo not in weft.algorithms(collective, self.hosts):
            runs = ", ".join(weft.algorithms(collective, self.hosts)) or "its one algorithm"
            raise weft.InvalidArgument(f"WEFT_ALGO={self.algo} has no {collective}: it runs {runs}")
        return super().bind(op, in_place, inp, out, root)

    def calls(self, root):
        c = self.comm
        both = {
            "all_reduce": lambda i, o: lambda: c.allreduce(i, out=o),
            "reduce_scatter": lambda i, o: lambda: c.reduce_scatter(i, out=o),
            "all_gather": lambda i, o: lambda: c.allgather(i, out=o),
            "reduce": lambda i, o: lambda: c.reduce(i, root=root, out=o),
        }
        table = {(op, f): make for op, make in both.items() for f in (False, True)}
        table["broadcast", True] = lambda i, o: lambda: c.broadcast(o, root=root)
        table["all_to_all", False] = lambda i, o: lambda: c.alltoall(i, o)
        return table

    def barrier(self):
        self.comm.barrier()

    def buffering(self):
        return weft_buffering(self.comm)

    def algorithm(self, op, block_bytes, in_place):
        """The tuner's choice, for the collectives it chooses for (weft.algorithms lists
        none for the others)."""
        import weft
        from weft.bench.ops import OPS

        collective = OPS[op].collective
        if not weft.algorithms(collective, self.hosts):
            return None
        return self.comm.algorithm(collective, block_bytes, in_place=in_place)[0]

    def trying(self, op, block_bytes, in_place):
        import weft
        from weft.bench.ops import OPS

        collective = OPS[op].collective
        if not weft.algorithms(collective, self.hosts):
            return False
        return self.comm.trying(collective, block_bytes, in_place=in_place)


class WeftAlgorithm(System):
    """An Algorithm from a file (weft.topo JSON, or MSCCL XML), run through weft's executor
    as topo.run runs it, on the op its collective is and at the sizes it divides."""

    label = "weft"

    def __init__(self, rank: int, size: int, store, spec: dict):
        import weft
        from weft import topo

        if spec["format"] == "msccl":  # with the root the run settled on (lineup.run_root)
            self.algo = topo.load_msccl(spec["path"], root=spec.get("root"))
        else:
            self.algo = topo.load(spec["path"])
        # A connection set per channel tag the Algorithm uses (topo.run numbers them 0, 1, ...).
        tags = {
            c if ch.tag is None else ch.tag
            for p in self.algo.programs
            for c, ch in enumerate(p.channels)
        }
        self.comm = weft.Communicator(
            store, rank, size, name=f"bench-plan-{spec['name']}", channels=max(2, len(tags))
        )
        self.refusals = (weft.InvalidArgument, topo.AlgorithmError)

    def bind(self, op, in_place, inp, out, root):
        from weft.bench.ops import OPS
        from weft.topo.run import prepare

        if OPS[op].collective != self.algo.collective:
            raise Unsupported(f"{self.algo.name} is a {self.algo.collective}")
        # weft's broadcast has no input: the root's data starts in its output, the one buffer
        # of the benchmark's (in-place) broadcast.
        one_buffer = self.algo.collective == "broadcast"
        if in_place != (self.algo.in_place or one_buffer):
            form = "in-place" if self.algo.in_place else "out-of-place"
            raise Unsupported(f"{self.algo.name} has only the {form} form")
        if OPS[op].rooted and root != self.algo.root:
            raise Unsupported(f"{self.algo.name} is for root {self.algo.root}, not {root}")
        i, o = inp.numpy(), out.numpy()
        if one_buffer:
            i = i[:0]
        units = self.algo.buffer_counts(self.comm.rank)
        if i.size % max(units["input"], 1) or o.size % max(units["output"], 1):
            raise Unsupported(
                f"{self.algo.name} runs on whole multiples of its {units['input']} input and "
                f"{units['output']} output elements only"
            )
        plan = prepare(self.algo, self.comm, i, o)  # checked once, run many times
        return lambda: self.comm.run_plan(plan, i, o)

    def barrier(self):
        self.comm.barrier()

    def buffering(self):
        return weft_buffering(self.comm)

    def algorithm(self, op, block_bytes, in_place):
        return self.algo.name


class TorchDistributed(System):
    """gloo, or NCCL on GPUs, through torch.distributed."""

    def __init__(self, rank: int, size: int, store, backend: str, device: str = "cpu"):
        import torch.distributed as dist

        self.dist, self.label, self.device = dist, backend, device
        if device != "cpu":
            torch.cuda.set_device(device)
        prefixed = dist.PrefixStore(f"bench/{backend}", store)
        dist.init_process_group(backend, store=prefixed, rank=rank, world_size=size)

    def calls(self, root):
        d = self.dist
        # torch 2.13 renamed the *_into_tensor / *_tensor forms.
        all_gather = getattr(d, "all_gather_single", None) or d.all_gather_into_tensor
        reduce_scatter = getattr(d, "reduce_scatter_single", None) or d.reduce_scatter_tensor
        return {
            ("all_reduce", True): lambda i, o: lambda: d.all_reduce(o),
            ("reduce_scatter", False): lambda i, o: lambda: reduce_scatter(o, i),
            ("reduce_scatter", True): lambda i, o: lambda: reduce_scatter(o, i),
            ("all_gather", False): lambda i, o: lambda: all_gather(o, i),
            ("all_gather", True): lambda i, o: lambda: all_gather(o, i),
            ("broadcast", True): lambda i, o: lambda: d.broadcast(o, root),
            ("reduce", True): lambda i, o: lambda: d.reduce(o, root),
            ("all_to_all", False): lambda i, o: lambda: d.all_to_all_single(o, i),
        }

    def barrier(self):
        self.dist.barrier()

    def sync(self):
        if self.device != "cpu":
            torch.cuda.synchronize()

    def close(self):
        self.dist.destroy_process_group()


class Mpi(System):
    """OpenMPI (or any MPI) through mpi4py; runs only in processes started by mpirun."""

    label = "mpi"
    DTYPES = {torch.float32, torch.float64, torch.int8, torch.uint8, torch.int32, torch.int64}

    def __init__(self):
        from mpi4py import MPI

        self.MPI, self.comm = MPI, MPI.COMM_WORLD

    def bind(self, op, in_place, inp, out, root):
        if inp.dtype not in self.DTYPES:
            raise Unsupported(f"MPI has no reduction type for {inp.dtype}")
        return super().bind(op, in_place, inp.numpy(), out.numpy(), root)

    def calls(self, root):
        c, IN_PLACE = self.comm, self.MPI.IN_PLACE
        at_root = c.rank == root
        return {
            ("all_reduce", False): lambda i, o: lambda: c.Allreduce(i, o),
            ("all_reduce", True): lambda i, o: lambda: c.Allreduce(IN_PLACE, o),
            # MPI's in-place reduce-scatter leaves the result at the start of the buffer, not
            # in the rank's block: not NCCL's in-place form, so not measured.
            ("reduce_scatter", False): lambda i, o: lambda: c.Reduce_scatter_block(i, o),
            ("all_gather", False): lambda i, o: lambda: c.Allgather(i, o),
            ("all_gather", True): lambda i, o: lambda: c.Allgather(IN_PLACE, o),
            ("broadcast", True): lambda i, o: lambda: c.Bcast(o, root=root),
            ("reduce", False): lambda i, o: lambda: c.Reduce(i, o, root=root),
            ("reduce", True): lambda i, o: (
                (lambda: c.Reduce(IN_PLACE, o, root=root))
                if at_root
                else (lambda: c.Reduce(i, None, root=root))
            ),
            ("all_to_all", False): lambda i, o: lambda: c.Alltoall(i, o),
        }

    def barrier(self):
        self.comm.Barrier()


def create(
    kind: str,
    rank: int,
    size: int,
    store,
    local_rank: int,
    algo: str | None = None,
    plan: dict | None = None,
    channels: int | None = None,
):
    """The adapter of a system kind in this rank (the environment is already set); `algo`
    is weft's family, `plan` an Algorithm file's (path, format, name) to run instead, `channels`
    the communicator's connection sets per peer (0 or None: WEFT_CHANNELS)."""
    if kind == "weft" and plan:
        return WeftAlgorithm(rank, size, store, plan)
    if kind == "weft":
        return Weft(rank, size, store, algo, channels or 0)
    if kind == "gloo":
        return TorchDistributed(rank, size, store, "gloo")
    if kind == "nccl":
        return TorchDistributed(rank, size, store, "nccl", f"cuda:{local_rank}")
    if kind == "mpi":
        return Mpi()
    raise ValueError(f"unknown system {kind!r}")
