"""simulate: an Algorithm (or a built-in family) on a Topology, as an event simulation.

>>> from weft import topo
>>> r = topo.simulate("ring", topo.Topology.ring(4096), 1 << 20)   # a built-in, by family
>>> r.time_s, r.busbw, r.fraction["bandwidth"]
>>> topo.simulate(topo.load("mine.json"), topo.Topology.torus((4, 4)), 64 << 10)

The simulation (csrc/core/sim/) runs the Plans with the CPU executor's semantics: a channel's steps
in order, a rank's channels concurrently (waiting where a step's deps say), steps streamed in
messages of at most the slice, each message taking a slot of its connection until the receiver
has consumed it, on links that carry one message at a time per direction (cut-through, in the
order they were sent; a token-bucket link passes what it saved while idle at once, then holds
its rate). Reductions cost gamma a byte; copies are free. Built-in Plans are made in
C++ rank by rank by the same code a communicator plans with, and kept in eight bytes a step.

The result's lower bounds are those any algorithm of the collective pays on the topology: latency
ceil(log2 p) x the quickest route between two ranks it used, bandwidth (allreduce: 2 (p - 1) / p x
n over a rank's injection bandwidth, the sum of its links'), and the cut between the ranks' two
halves (the bytes that must cross it over its bandwidth); ``fraction`` is each bound over the time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from weft._C import sim as _sim
from weft.topo.algorithm import Algorithm, AlgorithmError
from weft.topo.builtin import FAMILIES, TUNED
from weft.topo.topology import Topology, TopologyError

# nccl-tests' bus bandwidth factors, with n the bytes each rank contributes (allgather's block).
BUS_FACTOR = {
    "allreduce": lambda p: 2 * (p - 1) / p,
    "reduce_scatter": lambda p: (p - 1) / p,
    "allgather": lambda p: (p - 1) / p,
    "alltoall": lambda p: (p - 1) / p,
}


@dataclass
class SimResult:
    algorithm: str
    collective: str
    ranks: int
    nbytes: int  # the call's count in bytes (per rank, or per block)
    time_s: float
    algbw: float  # bytes per second: nbytes / time_s
    busbw: float
    messages: int
    bounds: dict[str, float]  # latency, bandwidth, cut: seconds
    fraction: dict[str, float]  # each bound / time_s
    rank_done_s: list[float] = field(repr=False)
    # Per hop (link index * 2 + direction, 0 from link.a to link.b): bytes and busy seconds.
    hop_bytes: list[float] = field(repr=False)
    hop_busy_s: list[float] = field(repr=False)
    topology: Topology = field(repr=False)
    trace: list[tuple[int, int, float, float]] = field(default_factory=list, repr=False)

    def link_use(self, top: int | None = None) -> list[dict]:
        """The hops that carried bytes, busiest first: from and to node names, bytes, busy
        seconds and the share of the run they were busy."""
        nodes, links = self.topology.nodes, self.topology.links
        used = [h for h, b in enumerate(self.hop_bytes) if b > 0]
        used.sort(key=lambda h: -self.hop_busy_s[h])
        out = []
        for h in used[:top]:
            link = links[h >> 1]
            a, b = (link.b, link.a) if h & 1 else (link.a, link.b)
            out.append(
                {
                    "link": h >> 1,
                    "from": nodes[a][0],
                    "to": nodes[b][0],
                    "class": link.cls,
                    "bytes": self.hop_bytes[h],
                    "busy_s": self.hop_busy_s[h],
                    "utilization": self.hop_busy_s[h] / self.time_s if self.time_s > 0 else 0.0,
                }
            )
        return out

    def __str__(self) -> str:
        frac = ", ".join(f"{k} {v:.2f}" for k, v in self.fraction.items())
        return (
            f"{self.algorithm} {self.collective} of {self.nbytes} B on {self.ranks} ranks: "
            f"{self.time_s * 1e6:.2f} us, algbw {self.algbw / 1e9:.3f} GB/s, busbw "
            f"{self.busbw / 1e9:.3f} GB/s, {self.messages} messages; of the lower bounds: {frac}"
        )


def simulate(
    algo,
    topology: Topology,
    nbytes: int | None = None,
    *,
    collective: str = "allreduce",
    in_place: bool = False,
    root: int = 0,
    elem_size: int = 4,
    slice_bytes: int | None = None,
    slots: int | None = None,
    step_bytes: int | None = None,
    gamma_s_per_b: float | None = None,
    trace_limit: int = 0,
    channels: int = 2,
    calls: int = 1,
) -> SimResult:
    """Simulates ``algo`` on ``topology`` for calls of ``nbytes`` (the count a call passes, in
    bytes: per rank for allreduce, per block for reduce_scatter, allgather and alltoall).
    ``algo`` is an Algorithm (scaled so that its count carries nbytes; its own size when nbytes
    is None) or a built-in family's name for ``collective``. ``slice_bytes`` (largest message),
    ``slots`` (messages in flight per connection, 8) and ``step_bytes`` (a built-in step's
    budget: the topology's, at most half of slots x slice) default to the topology's, or for an
    Algorithm at its own size to what it was planned for (``slot_bytes``, ``slots``); gamma
    (seconds a byte reduced) to the topology's. ``trace_limit``: keep the first that many wire
    uses in ``result.trace`` (hop, sending rank, start_s, end_s). A built-in is planned for
    ``channels`` connection sets per peer (a communicator's WEFT_CHANNELS, 2 by default).
    ``calls`` > 1 runs that many calls back to back on every rank, as a benchmark's loop does,
    the first half of them a warm-up: ``time_s`` is then the mean of the second half (per-hop
    figures and ``messages`` per call, averaged over all), which is what a token-bucket link
    (``Link.burst_bytes``) gives in a loop rather than from idle. On a topology whose ranks do
    not forward (``ranks_forward=False``), a message that only another rank's node could pass
    on is a TopologyError, in the words ``check`` uses."""
    if isinstance(calls, bool) or not isinstance(calls, int) or calls < 1:
        raise ValueError(f"simulate: calls must be a whole number >= 1, got {calls!r}")
    if not isinstance(topology, Topology):
        raise TopologyError(f"simulate needs a topo.Topology, got {type(topology).__name__}")
    p = topology.size
    if isinstance(algo, Algorithm):
        if algo.ranks != p:
            raise AlgorithmError(f"{algo.name} has {algo.ranks} ranks, the topology {p}")
        collective = algo.collective
        # At its own size, the buffering it was planned for; scaled, a communicator's.
        own = nbytes is None
        if own:
            nbytes = algo.count * algo.elem_size
        programs = _programs_of(algo, nbytes)
        name = algo.name
        slice_bytes = slice_bytes or (algo.slot_bytes if own else topology.slice_bytes)
        slots = slots or (algo.slots if own else 8)
    elif isinstance(algo, str):
        if nbytes is None:
            raise ValueError("simulate of a built-in family needs nbytes")
        slice_bytes = slice_bytes or topology.slice_bytes
        slots = slots or 8
        # As a communicator plans: a step fills at most half its connections' buffering.
        step_bytes = step_bytes or min(topology.step_bytes, max(1, slice_bytes * slots // 2))
        name, programs = _builtin(
            algo, collective, topology, nbytes, in_place, root, elem_size, step_bytes, channels
        )
    else:
        raise TypeError(f"simulate takes an Algorithm or a family name, got {type(algo).__name__}")
    if _ranks_could_relay(topology):
        _refuse_relays(name, programs, topology)
    topology = topology.at_buffer(nbytes)  # a calibrated topology's links at this size
    gamma = topology.gamma_s_per_b if gamma_s_per_b is None else gamma_s_per_b
    raw = _sim.simulate(
        topology.network(),
        programs,
        slice_bytes=slice_bytes,
        slots=slots,
        gamma_s_per_b=gamma,
        trace_limit=trace_limit,
        calls=calls,
        warmup_calls=calls // 2,
    )
    time_s = (raw["time_s"] - raw["warmed_s"]) / (calls - calls // 2)
    bounds = _bounds(collective, p, nbytes, topology, raw["min_route_latency_s"])
    algbw = nbytes / time_s if time_s > 0 else math.inf
    return SimResult(
        algorithm=name,
        collective=collective,
        ranks=p,
        nbytes=nbytes,
        time_s=time_s,
        algbw=algbw,
        busbw=algbw * BUS_FACTOR.get(collective, lambda p: 1.0)(p),
        messages=raw["messages"] // calls,
        bounds=bounds,
        fraction={k: (v / time_s if time_s > 0 else 1.0) for k, v in bounds.items()},
        rank_done_s=raw["rank_done"],
        hop_bytes=[b / calls for b in raw["hop_bytes"]],
        hop_busy_s=[b / calls for b in raw["hop_busy_s"]],
        topology=topology,
        trace=raw["trace"],
    )


def _builtin(family, collective, topology, nbytes, in_place, root, elem_size, step_bytes, channels):
    if collective not in FAMILIES or family not in FAMILIES[collective]:
        known = ", ".join(FAMILIES.get(collective, ()))
        raise ValueError(f"{collective!r} has no built-in family {family!r} (it has: {known})")
    if nbytes % elem_size:
        raise ValueError(f"nbytes {nbytes} is not a whole number of {elem_size}-byte elements")
    hosts = topology.graph.rank_hosts()
    programs = _sim.Programs(topology.size)
    name = programs.add_builtin(
        collective,
        family if collective in TUNED else "auto",
        nbytes // elem_size,
        elem_size=elem_size,
        root=root,
        in_place=in_place,
        max_step_bytes=step_bytes,
        hosts=hosts,
        channels=channels,
    )
    return name, programs


def _ranks_could_relay(topology: Topology) -> bool:
    """Whether the topology's ranks do not forward and one of them has two links to pass a
    message between (else every route the router finds is allowed)."""
    if topology.ranks_forward:
        return False
    degree = [0] * len(topology.nodes)
    for link in topology.links:
        degree[link.a] += 1
        degree[link.b] += 1
    return any(degree[node] >= 2 for node in topology.rank_nodes)


def _refuse_relays(name: str, programs, topology: Topology) -> None:
    """Raises for the first connection of ``programs`` that no route free of other ranks' nodes
    carries, in the words ``check`` uses."""
    for src, dst in programs.connections:
        fault = topology.route_fault(src, dst)
        if fault is not None:
            raise TopologyError(f"simulate: {name}: the topology ({topology.name}) {fault}")


def _programs_of(algo: Algorithm, nbytes: int):
    """The Algorithm's steps as the simulator takes them, each element nbytes / count bytes."""
    scale = nbytes / (algo.count * algo.elem_size) if algo.count else 0.0
    eb = algo.elem_size * scale

    def size(n):
        return round(n * eb)

    programs = _sim.Programs(algo.ranks)
    for r, program in enumerate(algo.programs):
        order = algo.issue_order(r)
        index = {key: i for i, key in enumerate(order)}
        steps = []
        for c, i in order:
            s = program.channels[c].steps[i]
            send = recv = compute = 0
            kind = "fused"
            if s.kind == "fused":
                send = recv = size(s.count)
                if s.recv is not None and s.local is not None:
                    compute = send
            elif s.kind == "exchange":
                kind = "exchange"
                send = size(s.local.count) if s.local else 0
                recv = size(s.dst.count) if s.dst else 0
                compute = recv if s.operand else 0
            else:  # local_reduce, reduce: no messages
                kind = "compute"
                blocks = s.local.count // s.count if s.kind == "local_reduce" and s.count else 2
                compute = size((blocks - 1) * s.count)
            after = [index[tuple(d)] for d in s.deps]
            steps.append(
                (
                    kind,
                    -1 if s.recv is None or kind == "compute" else s.recv,
                    -1 if s.send is None or kind == "compute" else s.send,
                    send,
                    recv,
                    compute,
                    s.wait_sends,
                    c,
                    after,
                )
            )
        tags = [c if ch.tag is None else ch.tag for c, ch in enumerate(program.channels)]
        programs.add_rank(r, steps, tags)
    return programs


def _bounds(collective, p, nbytes, topology, alpha) -> dict[str, float]:
    if p < 2:
        return {}
    graph = topology.graph
    inject = [0.0] * len(graph.nodes)
    for link in graph.links:
        inject[link.a] += link.bandwidth_Bps
        inject[link.b] += link.bandwidth_Bps
    beta = 1 / min(inject[node] for node in graph.ranks)
    half, rest = p // 2, p - p // 2
    # Bytes a rank must send (bandwidth) and that must cross the cut one way (cut).
    moved = {
        "allreduce": (2 * (p - 1) / p * nbytes, nbytes),
        "reduce_scatter": ((p - 1) * nbytes, rest * nbytes),
        "allgather": ((p - 1) * nbytes, rest * nbytes),
        "alltoall": ((p - 1) * nbytes, half * rest * nbytes),
        "broadcast": (nbytes, nbytes),
        "reduce": (nbytes, nbytes),
    }.get(collective, (0, 0))
    cut = graph.cut_bandwidth()
    return {
        "latency": math.ceil(math.log2(p)) * alpha,
        "bandwidth": moved[0] * beta,
        "cut": moved[1] / cut if cut > 0 else 0.0,
    }
