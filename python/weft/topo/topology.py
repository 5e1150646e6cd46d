"""Topology: a network of ranks, hosts, NICs and switches, with links of a latency, a bandwidth and
a duplex; what ``topo.simulate`` runs Algorithms on.

>>> from weft import topo
>>> ring = topo.Topology.ring(4096)                       # every builder works with defaults
>>> world = topo.Topology.hosts(8, 4)                     # 8 hosts x 4 GPUs, NVLink in, NICs out
>>> world.route(0, 31)                                    # node names along the shortest path
>>> topo.choose("allreduce", 64 << 20, world)             # the closed-form model takes it too

A Topology is also the closed-form cost model's view of a world (``Topology(size=..., hosts=...)``,
as ``predict`` and ``choose`` take it): built that way it has no links until it is simulated,
when it gets those of ``Topology.hosts`` with the cost model's default figures.

Links belong to classes (``nvlink``, ``pcie``, ``nic``, ``link``): ``with_class`` sets one class's
latency and bandwidth, ``from_cost_model`` sets them from a communicator's measured cost model or a
``weft-bench --tune`` file. Latencies are seconds per link crossed, bandwidths bytes per second.
Routes are shortest paths in hops, the same every time (equal ones spread by a hash of the ranks
and the channel's tag). ``ranks_forward=False`` says the ranks' nodes pass on no one else's
messages (GPUs joined by direct links do not; switches and NICs still relay): routes then avoid
other ranks' nodes, and a pair joined only through them has none.
"""

from __future__ import annotations

import json
import math
from collections import Counter, deque
from dataclasses import dataclass, replace
from pathlib import Path

from weft._C import sim as _sim
from weft._C.topo import CostModel, at_buffer, load_cost_model
from weft._C.topo import Topology as _ClosedForm

FORMAT = "weft-topology/1"
NODE_KINDS = ("rank", "nic", "switch")
# Rank-to-rank figures the builders default to: a GPU server's NVLink inside a host, a 100 Gbit/s
# NIC outside; one link's latency is what a rank-to-rank message pays, split over the links.
NVLINK = (1e-6, 150e9)
NIC = (5e-6, 12.5e9)
_DEFAULT = _ClosedForm(size=1)


class TopologyError(ValueError):
    """A topology (or its file) that is malformed: the message says where and what."""


@dataclass(frozen=True)
class Link:
    a: int  # node indices
    b: int
    latency_s: float
    bandwidth_Bps: float  # bytes per second
    duplex: bool = True  # each direction its own wire; False: both share one
    cls: str = "link"  # the link's class, which calibration sets as one
    # A token bucket (a rate limiter: tc's tbf, a cloud instance's bandwidth allowance): the
    # bytes saved up while the link idled, which then pass at the pace of the hops before it;
    # bandwidth_Bps is the rate it refills at and sustains. 0: a plain link.
    burst_bytes: float = 0.0


@dataclass(frozen=True)
class CpuPool:
    """Cores that ranks share, as one machine's: every message one of ``ranks`` sends first
    takes one of ``cores`` for ``s_per_message`` + bytes x ``s_per_b``, what a socket's system
    calls and copies cost the machine, and crosses its wires cut-through behind it; every
    reduction one of them runs takes a core for its time too, and a rank does one such piece of
    work at a time (its channels share its thread). Ranks in no pool send and reduce without
    waiting for a core (each has the CPU it needs)."""

    ranks: tuple[int, ...]
    cores: int
    s_per_b: float
    s_per_message: float = 0.0


class _BuilderOrField:
    """``Topology.hosts(n_hosts, per_host)`` builds a network; ``topology.hosts`` is the closed
    form's count of hosts (the C++ field), as it always was."""

    def __init__(self, name, build):
        self.field = _ClosedForm.__dict__[name]
        self.build = build
        self.__doc__ = build.__doc__

    def __get__(self, obj, cls=None):
        if obj is None:
            return self.build.__get__(cls, type(cls))
        return self.field.__get__(obj, cls)

    def __set__(self, obj, value):
        self.field.__set__(obj, value)


class Topology(_ClosedForm):
    """A network of nodes and links, and the closed-form model's view of it (size, hosts, ...)."""

    # What simulate charges a byte reduced, unless told (from_cost_model sets the measured one).
    gamma_s_per_b = CostModel().gamma_s_per_b

    def __init__(
        self,
        size: int | None = None,
        hosts: int = 1,
        ranks_per_host: int = -1,
        any_tcp: bool = False,
        ranks_by_host: bool = True,
        step_bytes: int = _DEFAULT.step_bytes,
        slice_bytes: int = _DEFAULT.slice_bytes,
        *,
        name: str | None = None,
        nodes: list[tuple[str, str, int | None]] | None = None,
        ranks: list[int] | None = None,
        links: list[Link] | None = None,
        cpus: list[CpuPool] | None = None,
        ranks_forward: bool = True,
    ):
        """Closed form: ``Topology(size=..., hosts=...)`` as before. A network: ``nodes`` as
        (name, kind, host or None), ``ranks`` the node of each rank, ``links``, and ``cpus``
        the CpuPools ranks share, if any. ``ranks_forward``: whether a rank's node passes on
        messages between other ranks (False: routes avoid other ranks' nodes)."""
        if not isinstance(ranks_forward, bool):
            raise TopologyError(f"ranks_forward must be True or False, got {ranks_forward!r}")
        self.ranks_forward = ranks_forward
        if nodes is None:
            if size is None:
                raise TopologyError("Topology needs size= (closed form) or nodes=, ranks=, links=")
            super().__init__(
                size, hosts, ranks_per_host, any_tcp, ranks_by_host, step_bytes, slice_bytes
            )
            self._graph = None
            self.name = name or f"closed form: {size} ranks on {hosts} host(s)"
            return
        graph = _Graph(list(nodes), list(ranks or []), list(links or []), list(cpus or []))
        graph.validate()
        host_of = graph.rank_hosts()
        layout = Counter(host_of)
        per_host = set(layout.values())
        super().__init__(
            len(graph.ranks),
            len(layout),
            per_host.pop() if len(per_host) == 1 else 0,
            len(layout) > 1,
            host_of == sorted(host_of),
            step_bytes,
            slice_bytes,
        )
        self._graph = graph
        self.name = name or "network"

    # ---- the network ------------------------------------------------------------------------

    @property
    def graph(self) -> _Graph:
        """Nodes and links; a closed-form Topology gets those of ``Topology.hosts``."""
        if self._graph is None:
            if self.ranks_per_host < 1:
                raise TopologyError(
                    "a closed-form Topology with uneven hosts has no network: build one with "
                    "Topology.hosts or from nodes and links"
                )
            model = CostModel()
            built = Topology.hosts(
                self.hosts,
                self.ranks_per_host,
                nvlink=(model.shm.alpha_s, 1 / model.shm.beta_s_per_b),
                nic=(model.tcp.alpha_s, 1 / model.tcp.beta_s_per_b),
            )
            self._graph = built._graph
        return self._graph

    @property
    def nodes(self) -> list[tuple[str, str, int | None]]:
        return self.graph.nodes

    @property
    def links(self) -> list[Link]:
        return self.graph.links

    @property
    def rank_nodes(self) -> list[int]:
        return self.graph.ranks

    def network(self):
        """The C++ network the simulator and the router use (built once): where ranks do not
        forward, its routes go around other ranks' nodes."""
        return self.graph.network(self.ranks_forward)

    def route(self, from_rank: int, to_rank: int, tag: int = 0) -> list[str] | None:
        """Node names along the route from one rank to another, or None when none joins them
        (``tag``: a channel's connection tag, which spreads equal routes as the hash does).
        Where ranks do not forward, only routes free of other ranks' nodes count."""
        return self.graph.names(from_rank, self.network().route(from_rank, to_rank, tag))

    def route_links(
        self, from_rank: int, to_rank: int, tag: int = 0
    ) -> list[tuple[int, int]] | None:
        """(link index, direction) pairs of the route (direction 0 from link.a to link.b)."""
        hops = self.network().route(from_rank, to_rank, tag)
        return None if hops is None else [(h >> 1, h & 1) for h in hops]

    def route_fault(self, from_rank: int, to_rank: int) -> str | None:
        """Why no route carries a message from one rank to another, or None: the words that
        ``check`` and ``simulate`` report, naming the ranks' nodes between where ranks do not
        forward and only such routes join the two."""
        if self.network().route(from_rank, to_rank, 0) is not None:
            return None
        hops = self.graph.network(True).route(from_rank, to_rank, 0)
        if hops is None:
            return f"has no route from rank {from_rank} to rank {to_rank}"
        relays = [self.graph.nodes[node][0] for node in self.graph.relays(hops)]
        whose = "another rank's node" if len(relays) == 1 else "other ranks' nodes"
        return (
            f"joins rank {from_rank} to rank {to_rank} only through {', '.join(relays)}, "
            f"{whose}, and ranks do not forward"
        )

    def with_class(
        self, cls: str, latency_s: float | None = None, bandwidth_Bps: float | None = None
    ) -> Topology:
        """A copy whose links of class ``cls`` have the given latency and/or bandwidth."""
        if cls not in {link.cls for link in self.links}:
            known = ", ".join(sorted({link.cls for link in self.links}))
            raise TopologyError(f"{self.name} has no links of class {cls!r} (it has: {known})")
        links = [
            replace(
                link,
                latency_s=link.latency_s if latency_s is None else latency_s,
                bandwidth_Bps=link.bandwidth_Bps if bandwidth_Bps is None else bandwidth_Bps,
            )
            if link.cls == cls
            else link
            for link in self.links
        ]
        return self._copy(links=links)

    def with_ranks_forward(self, ranks_forward: bool) -> Topology:
        """A copy whose ranks do (True) or do not (False) pass on other ranks' messages."""
        copy = self._copy(ranks_forward=ranks_forward)
        copy.gamma_s_per_b = self.gamma_s_per_b
        copy._calibration = self._calibration
        return copy

    def _copy(self, **changes) -> Topology:
        g = self.graph
        return Topology(
            nodes=changes.get("nodes", g.nodes),
            ranks=changes.get("ranks", g.ranks),
            links=changes.get("links", g.links),
            cpus=changes.get("cpus", g.cpus),
            name=self.name,
            step_bytes=self.step_bytes,
            slice_bytes=self.slice_bytes,
            ranks_forward=changes.get("ranks_forward", self.ranks_forward),
        )

    def sharing_cpus(self, cores: int, s_per_b: float, s_per_message: float = 0.0) -> Topology:
        """A copy whose ranks all share one machine's ``cores`` (CpuPool): every message costs
        its sender ``s_per_message`` + bytes x ``s_per_b`` on one of them, and every reduction
        its time on one."""
        pool = CpuPool(tuple(range(self.size)), cores, s_per_b, s_per_message)
        return self._copy(cpus=[pool])

    def __repr__(self) -> str:
        if self._graph is None:
            return f"Topology(size={self.size}, hosts={self.hosts})"
        g = self._graph
        shape = f"{len(g.ranks)} ranks, {len(g.nodes)} nodes, {len(g.links)} links"
        if not self.ranks_forward:
            shape += ", ranks do not forward"
        return f"Topology({self.name!r}: {shape})"

    # ---- builders ----------------------------------------------------------------------------

    @classmethod
    def ring(
        cls,
        n: int,
        *,
        latency_s: float = NIC[0],
        bandwidth_Bps: float = NIC[1],
        ranks_forward: bool = True,
    ) -> Topology:
        """n ranks, each linked to the next (the last to the first); ``ranks_forward=False``:
        they pass on no one else's messages, so only neighbours talk."""
        _need(n >= 1, f"ring needs n >= 1, got {n}")
        b = _Builder()
        ranks = [b.rank(f"rank{r}", r) for r in range(n)]
        for r in range(n if n > 2 else n - 1):
            b.link(ranks[r], ranks[(r + 1) % n], latency_s, bandwidth_Bps, "link")
        return b.build(f"ring({n})", ranks_forward)

    @classmethod
    def fully_connected(
        cls,
        n: int,
        *,
        latency_s: float = NIC[0],
        bandwidth_Bps: float = NIC[1],
        ranks_forward: bool = True,
    ) -> Topology:
        """n ranks with a link between every pair (n (n - 1) / 2 links, so n <= 1024);
        ``ranks_forward`` as for ``ring``."""
        _need(1 <= n <= 1024, f"fully_connected needs 1 <= n <= 1024 (links grow as n^2), got {n}")
        b = _Builder()
        ranks = [b.rank(f"rank{r}", r) for r in range(n)]
        for i in range(n):
            for j in range(i + 1, n):
                b.link(ranks[i], ranks[j], latency_s, bandwidth_Bps, "link")
        return b.build(f"fully_connected({n})", ranks_forward)

    @classmethod
    def switch(
        cls,
        n: int,
        *,
        latency_s: float = NIC[0],
        bandwidth_Bps: float = NIC[1],
        ranks_forward: bool = True,
    ) -> Topology:
        """n ranks on one switch; rank to rank pays ``latency_s`` (half on each link).
        ``ranks_forward=False``: ranks pass on no one else's messages, which changes no route
        (every pair talks through the switch)."""
        _need(n >= 1, f"switch needs n >= 1, got {n}")
        b = _Builder()
        sw = b.node("switch", "switch")
        for r in range(n):
            b.link(b.rank(f"rank{r}", r), sw, latency_s / 2, bandwidth_Bps, "nic")
        return b.build(f"switch({n})", ranks_forward)

    @classmethod
    def fat_tree(
        cls,
        n: int = 64,
        per_leaf: int = 8,
        spines: int | None = None,
        *,
        latency_s: float = NIC[0],
        bandwidth_Bps: float = NIC[1],
        ranks_forward: bool = True,
    ) -> Topology:
        """A two-level folded Clos: leaf switches of ``per_leaf`` ranks, each linked to every one
        of ``spines`` spine switches (by default per_leaf: full bisection). Rank to rank through a
        spine pays ``latency_s`` (a quarter on each link). ``ranks_forward=False``: ranks pass on
        no one else's messages, which changes no route (leaves and spines carry them all)."""
        spines = per_leaf if spines is None else spines
        _need(n >= 1 and per_leaf >= 1 and spines >= 1, "fat_tree needs n, per_leaf, spines >= 1")
        b = _Builder()
        spine = [b.node(f"spine{s}", "switch") for s in range(spines)]
        leaves = []
        for r in range(n):
            if r % per_leaf == 0:
                leaves.append(b.node(f"leaf{len(leaves)}", "switch"))
                for s in spine:
                    b.link(leaves[-1], s, latency_s / 4, bandwidth_Bps, "nic")
            b.link(b.rank(f"rank{r}", r), leaves[-1], latency_s / 4, bandwidth_Bps, "nic")
        return b.build(f"fat_tree({n}, per_leaf={per_leaf}, spines={spines})", ranks_forward)

    @classmethod
    def torus(
        cls,
        dims=(4, 4),
        *,
        latency_s: float = NIC[0],
        bandwidth_Bps: float = NIC[1],
        ranks_forward: bool = True,
    ) -> Topology:
        """A k-D torus: ranks numbered row-major over ``dims``, each linked to its neighbour in
        each dimension (wrapping around; a dimension of 2 has one link, of 1 none).
        ``ranks_forward=False``: GPUs on direct links rather than routing chips, so only
        neighbours talk."""
        dims = tuple(dims)
        _need(
            dims and all(isinstance(d, int) and d >= 1 for d in dims),
            f"torus needs dims of positive integers, got {dims!r}",
        )
        n = math.prod(dims)
        b = _Builder()
        ranks = [b.rank(f"rank{r}", r) for r in range(n)]
        stride = 1
        for d in reversed(dims):
            for r in range(n):
                x = (r // stride) % d
                if d > 2 or (d == 2 and x == 0):
                    nxt = r + ((x + 1) % d - x) * stride
                    b.link(ranks[r], ranks[nxt], latency_s, bandwidth_Bps, "link")
            stride *= d
        return b.build(f"torus({', '.join(map(str, dims))})", ranks_forward)

    def _hosts(
        cls,
        n_hosts: int = 2,
        per_host: int = 8,
        *,
        nvlink: tuple[float, float] = NVLINK,
        nic: tuple[float, ...] = NIC,
        nics_per_host: int = 1,
        ranks_forward: bool = True,
    ) -> Topology:
        """``n_hosts`` hosts of ``per_host`` ranks: inside a host every rank on the host's NVLink
        switch; outside, the host's NICs (``nics_per_host``, ranks sharing them in turn) on one
        network switch. ``nvlink`` and ``nic`` are (latency_s, bandwidth_Bps) rank to rank:
        inside a host a message pays nvlink's latency, across hosts nic's, at the slower
        bandwidth on its path. A third figure in ``nic``, burst_bytes, makes each NIC's link a
        token bucket (``Link.burst_bytes``). ``ranks_forward=False``: GPUs inside a host do not
        relay for each other, which changes no route (traffic goes via the host's NVLink switch
        and NICs)."""
        _need(n_hosts >= 1 and per_host >= 1, "hosts needs n_hosts >= 1 and per_host >= 1")
        _need(1 <= nics_per_host <= per_host, "hosts needs 1 <= nics_per_host <= per_host")
        burst = _nic_burst(nic)
        b = _Builder()
        net = b.node("switch", "switch") if n_hosts > 1 else None
        for h in range(n_hosts):
            sw = b.node(f"host{h}.nvswitch", "switch", h)
            for g in range(per_host):
                r = b.rank(f"host{h}.rank{g}", h * per_host + g, h)
                b.link(r, sw, nvlink[0] / 2, nvlink[1], "nvlink")
            for i in range(nics_per_host if net is not None else 0):
                nic_node = b.node(f"host{h}.nic{i}", "nic", h)
                b.link(sw, nic_node, 0.0, nvlink[1], "pcie")
                b.link(nic_node, net, max(0.0, nic[0] - nvlink[0]) / 2, nic[1], "nic", burst)
        return b.build(f"hosts({n_hosts}, {per_host})", ranks_forward)

    hosts = _BuilderOrField("hosts", _hosts)

    @classmethod
    def rail_optimized(
        cls,
        n_hosts: int = 4,
        per_host: int = 8,
        *,
        nvlink: tuple[float, float] = NVLINK,
        nic: tuple[float, ...] = NIC,
        ranks_forward: bool = True,
    ) -> Topology:
        """Hosts of ``per_host`` ranks on an NVLink switch, each rank with its own NIC on the
        rail switch of its local index, the rails joined by a spine: local index g talks to g on
        other hosts through rail g alone. Figures as for ``hosts`` (a burst, on the NICs'
        links). ``ranks_forward=False``: GPUs inside a host do not relay for each other, so a
        GPU reaches another host's GPU of another rail over the spine, never through a GPU of
        its own host and that GPU's NIC."""
        _need(n_hosts >= 1 and per_host >= 1, "rail_optimized needs n_hosts, per_host >= 1")
        burst = _nic_burst(nic)
        b = _Builder()
        rails = [b.node(f"rail{g}", "switch") for g in range(per_host)]
        spine = b.node("spine", "switch")
        for rail in rails:
            b.link(rail, spine, max(0.0, nic[0] - nvlink[0]) / 4, nic[1], "nic")
        for h in range(n_hosts):
            sw = b.node(f"host{h}.nvswitch", "switch", h)
            for g in range(per_host):
                r = b.rank(f"host{h}.rank{g}", h * per_host + g, h)
                b.link(r, sw, nvlink[0] / 2, nvlink[1], "nvlink")
                nic_node = b.node(f"host{h}.nic{g}", "nic", h)
                b.link(r, nic_node, nvlink[0] / 2, nvlink[1], "pcie")
                b.link(nic_node, rails[g], max(0.0, nic[0] - nvlink[0]) / 2, nic[1], "nic", burst)
        return b.build(f"rail_optimized({n_hosts}, {per_host})", ranks_forward)

    @classmethod
    def from_cost_model(
        cls,
        model=None,
        n_hosts: int = 1,
        per_host: int = 2,
        *,
        nics_per_host: int = 1,
        nic_burst_bytes: float = 0.0,
        machine_cores: int = 0,
        ranks_forward: bool = True,
    ) -> Topology:
        """``Topology.hosts(n_hosts, per_host)`` with link figures from a cost model: a
        Communicator's ``cost_model`` (measured on its ranks when it was created), a file that
        ``weft-bench --tune`` or ``save_cost_model`` wrote (a path), or the defaults (None).
        Inside a host messages cost the model's shared-memory alpha and 1 / beta, across hosts
        its tcp figures; its gamma is what ``simulate`` charges for reductions (``model=``).
        Where the model has large-buffer betas, ``at_buffer(nbytes)`` gives the links at a
        call's size (what ``simulate`` runs on); the links here are those of small buffers.
        ``nic_burst_bytes``: the hosts' links are token buckets of that size (rate limiters,
        as ``weft.netns`` hosts' are), which the model's betas do not say.

        ``machine_cores``: every rank runs on one machine of that many cores (local ranks: hosts
        of one rank over tcp, or one host over shared memory). The probe measured alpha and
        beta with every rank exchanging at once, so where ranks outnumber cores they are what
        a rank gets while the others take turns on the cores: each message then costs its
        sender (alpha + bytes x beta) x min(cores, ranks) / ranks on one of the cores (a
        CpuPool), what it takes of a core of its own, the links carry it at that beta, and
        reductions take the cores too.

        ``ranks_forward``: as for ``hosts``."""
        if model is None:
            model = CostModel()
        elif isinstance(model, (str, Path)):
            model = load_cost_model(str(model))
        if not isinstance(model, CostModel):
            raise TopologyError(
                f"from_cost_model takes a CostModel or a path, got {type(model).__name__}"
            )
        for name, link in (("shm", model.shm), ("tcp", model.tcp)):
            if not (link.alpha_s >= 0 and link.beta_s_per_b > 0):
                raise TopologyError(f"the cost model's {name} link needs alpha >= 0 and beta > 0")
        if machine_cores:
            _need(
                isinstance(machine_cores, int) and machine_cores >= 1,
                f"machine_cores must be a whole number >= 1, got {machine_cores!r}",
            )
            _need(
                n_hosts == 1 or per_host == 1,
                "machine_cores: one machine's ranks talk over one transport (hosts of one rank "
                "over tcp, or one host over shared memory)",
            )
        shape = (n_hosts, per_host, nics_per_host, nic_burst_bytes, machine_cores)
        world = cls._calibrated(model, *shape, ranks_forward=ranks_forward)
        world._calibration = (model, *shape)
        return world

    @classmethod
    def _calibrated(
        cls,
        model,
        n_hosts,
        per_host,
        nics_per_host,
        nic_burst_bytes,
        machine_cores,
        *,
        ranks_forward,
    ) -> Topology:
        shm, tcp = model.shm.beta_s_per_b, model.tcp.beta_s_per_b
        ranks = n_hosts * per_host
        share = min(machine_cores, ranks) / ranks if machine_cores else 1.0
        on_a_core = (tcp if n_hosts > 1 else shm) * share  # a message's CPU seconds per byte
        # ... and per message: its system calls at both ends, and on loopback its wake-up
        per_message = (model.tcp if n_hosts > 1 else model.shm).alpha_s * share
        if machine_cores:
            shm, tcp = (shm, on_a_core) if n_hosts > 1 else (on_a_core, tcp)
        world = cls.hosts(
            n_hosts,
            per_host,
            nvlink=(model.shm.alpha_s, 1 / shm),
            nic=(model.tcp.alpha_s, 1 / tcp, nic_burst_bytes),
            nics_per_host=nics_per_host,
            ranks_forward=ranks_forward,
        )
        if machine_cores:
            world = world.sharing_cpus(machine_cores, on_a_core, per_message)
        world.name = f"{world.name} calibrated"
        world.gamma_s_per_b = model.gamma_s_per_b
        return world

    _calibration = None  # from_cost_model's arguments

    def at_buffer(self, nbytes: int) -> Topology:
        """This topology for calls on ``nbytes`` per rank. One that ``from_cost_model`` made
        from a model with large-buffer betas (``weft-bench --tune`` measures them) gets its
        links' bandwidths at that size (``at_buffer`` of the model: in-cache up to its
        small_bytes, from memory from its large_bytes); any other topology is itself.
        ``simulate`` calls it."""
        if self._calibration is None or not self._calibration[0].large_bytes:
            return self
        model, *shape = self._calibration
        return self._calibrated(at_buffer(model, nbytes), *shape, ranks_forward=self.ranks_forward)

    # ---- JSON --------------------------------------------------------------------------------

    def to_json(self) -> dict:
        g = self.graph
        return {
            "format": FORMAT,
            "name": self.name,
            "step_bytes": self.step_bytes,
            "slice_bytes": self.slice_bytes,
            "ranks_forward": self.ranks_forward,
            "nodes": [
                {"name": n, "kind": k} | ({} if h is None else {"host": h}) for n, k, h in g.nodes
            ],
            "ranks": list(g.ranks),
            "links": [
                {
                    "a": link.a,
                    "b": link.b,
                    "latency_s": link.latency_s,
                    "bandwidth_Bps": link.bandwidth_Bps,
                    "duplex": link.duplex,
                    "class": link.cls,
                }
                | ({"burst_bytes": link.burst_bytes} if link.burst_bytes else {})
                for link in g.links
            ],
        } | (
            {
                "cpus": [
                    {"ranks": list(p.ranks), "cores": p.cores, "s_per_b": p.s_per_b}
                    | ({"s_per_message": p.s_per_message} if p.s_per_message else {})
                    for p in g.cpus
                ]
            }
            if g.cpus
            else {}
        )

    def save(self, path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n")

    @staticmethod
    def from_json(data, source: str = "topology") -> Topology:
        return _parse(data, source)

    @staticmethod
    def load(path) -> Topology:
        try:
            data = json.loads(Path(path).read_text())
        except json.JSONDecodeError as e:
            raise TopologyError(f"{path}: not JSON: {e}") from None
        return _parse(data, str(path))


def load_topology(path) -> Topology:
    """Reads a Topology that ``Topology.save`` wrote; every field is checked first."""
    return Topology.load(path)


def _need(ok, what: str) -> None:
    if not ok:
        raise TopologyError(what)


def _nic_burst(nic: tuple) -> float:
    """A builder's nic figures: (latency_s, bandwidth_Bps) and, optionally, burst_bytes."""
    _need(len(nic) in (2, 3), f"nic is (latency_s, bandwidth_Bps[, burst_bytes]), got {nic!r}")
    burst = nic[2] if len(nic) == 3 else 0.0
    _need(math.isfinite(burst) and burst >= 0, f"a nic's burst_bytes must be >= 0, got {burst!r}")
    return float(burst)


class _Graph:
    def __init__(self, nodes, ranks, links, cpus=()):
        self.nodes = nodes
        self.ranks = ranks
        self.links = links
        self.cpus = list(cpus)
        self._networks = {}  # by whether ranks forward

    def validate(self) -> None:
        n = len(self.nodes)
        _need(n >= 1 and self.ranks, "a network needs at least one node and one rank")
        for i, (name, kind, _host) in enumerate(self.nodes):
            _need(
                kind in NODE_KINDS, f"node {i} ({name}): kind {kind!r} is not one of {NODE_KINDS}"
            )
        for r, node in enumerate(self.ranks):
            _need(0 <= node < n, f"rank {r} sits on node {node}, outside 0..{n - 1}")
            _need(self.nodes[node][1] == "rank", f"rank {r} sits on node {node}, not a rank node")
        _need(len(set(self.ranks)) == len(self.ranks), "two ranks sit on one node")
        for i, link in enumerate(self.links):
            _need(
                0 <= link.a < n and 0 <= link.b < n and link.a != link.b,
                f"link {i} joins nodes {link.a} and {link.b}: two distinct nodes of 0..{n - 1}",
            )
            _need(
                link.latency_s >= 0 and link.bandwidth_Bps > 0 and link.burst_bytes >= 0,
                f"link {i} needs latency_s >= 0, bandwidth_Bps > 0 and burst_bytes >= 0",
            )
        pooled = set()
        for i, pool in enumerate(self.cpus):
            _need(
                isinstance(pool.cores, int) and pool.cores >= 1,
                f"CPU pool {i} needs a whole number of cores >= 1, got {pool.cores!r}",
            )
            for name in ("s_per_b", "s_per_message"):
                cost = getattr(pool, name)
                _need(
                    math.isfinite(cost) and cost >= 0,
                    f"CPU pool {i} needs {name} finite and >= 0, got {cost!r}",
                )
            for r in pool.ranks:
                _need(0 <= r < len(self.ranks), f"CPU pool {i} names rank {r}, not a rank")
                _need(r not in pooled, f"rank {r} is in two CPU pools")
                pooled.add(r)

    def rank_hosts(self) -> list[int]:
        """A host index per rank; a rank outside any host is a host of its own."""
        out, fresh = [], max([h for _, _, h in self.nodes if h is not None], default=-1) + 1
        for node in self.ranks:
            host = self.nodes[node][2]
            if host is None:
                host, fresh = fresh, fresh + 1
            out.append(host)
        return out

    def network(self, ranks_forward: bool = True):
        if ranks_forward not in self._networks:
            self._networks[ranks_forward] = _sim.Network(
                len(self.nodes),
                self.ranks,
                [
                    (x.a, x.b, x.latency_s, x.bandwidth_Bps, x.duplex, x.burst_bytes)
                    for x in self.links
                ],
                [(pool.cores, pool.s_per_b, pool.s_per_message) for pool in self.cpus],
                self._rank_pools(),
                ranks_forward,
            )
        return self._networks[ranks_forward]

    def names(self, from_rank: int, hops: list[int] | None) -> list[str] | None:
        """Node names along hops (link * 2 + direction) from a rank's node."""
        if hops is None:
            return None
        names = [self.nodes[self.ranks[from_rank]][0]]
        for h in hops:
            link = self.links[h >> 1]
            names.append(self.nodes[link.a if h & 1 else link.b][0])
        return names

    def relays(self, hops: list[int]) -> list[int]:
        """The ranks' nodes that hops pass through (not the ends)."""
        inner = [self.links[h >> 1].a if h & 1 else self.links[h >> 1].b for h in hops[:-1]]
        ranks = set(self.ranks)
        return [node for node in inner if node in ranks]

    def _rank_pools(self) -> list[int]:
        if not self.cpus:
            return []
        of = [-1] * len(self.ranks)
        for i, pool in enumerate(self.cpus):
            for r in pool.ranks:
                of[r] = i
        return of

    def cut_bandwidth(self) -> float:
        """Bandwidth (per direction) of the links between the ranks' two halves (ranks below
        n / 2 and the rest), every other node joining the half that reaches it first."""
        side = [-1] * len(self.nodes)
        adj = [[] for _ in self.nodes]
        for i, link in enumerate(self.links):
            adj[link.a].append((link.b, i))
            adj[link.b].append((link.a, i))
        half = len(self.ranks) // 2
        queue = deque()
        for r, node in enumerate(self.ranks):
            side[node] = 0 if r < half else 1
            queue.append(node)
        while queue:
            u = queue.popleft()
            for v, _ in adj[u]:
                if side[v] < 0:
                    side[v] = side[u]
                    queue.append(v)
        return sum(x.bandwidth_Bps for x in self.links if side[x.a] != side[x.b] >= 0)


class _Builder:
    def __init__(self):
        self.nodes, self.ranks, self.links = [], [], []

    def node(self, name, kind, host=None) -> int:
        self.nodes.append((name, kind, host))
        return len(self.nodes) - 1

    def rank(self, name, r, host=None) -> int:
        assert r == len(self.ranks)
        self.ranks.append(self.node(name, "rank", host))
        return self.ranks[-1]

    def link(self, a, b, latency_s, bandwidth_Bps, cls, burst_bytes=0.0) -> None:
        self.links.append(
            Link(a, b, float(latency_s), float(bandwidth_Bps), True, cls, float(burst_bytes))
        )

    def build(self, name, ranks_forward=True) -> Topology:
        return Topology(
            nodes=self.nodes,
            ranks=self.ranks,
            links=self.links,
            name=name,
            ranks_forward=ranks_forward,
        )


TOP_KEYS = {
    "format",
    "name",
    "step_bytes",
    "slice_bytes",
    "ranks_forward",
    "nodes",
    "ranks",
    "links",
    "cpus",
}
CPU_KEYS = {"ranks", "cores", "s_per_b", "s_per_message"}
MOST_BYTES = 1 << 40  # a step's budget or a slice, in a file
NODE_KEYS = {"name", "kind", "host"}
LINK_KEYS = {"a", "b", "latency_s", "bandwidth_Bps", "duplex", "class", "burst_bytes"}


def _parse(data, source: str) -> Topology:
    def fail(where, what):
        raise TopologyError(f"{source}: {where}: {what}")

    def obj(value, keys, where):
        if not isinstance(value, dict):
            fail(where, f"expected an object, got {type(value).__name__}")
        if set(value) - keys:
            fail(where, f"unknown key(s) {', '.join(sorted(set(value) - keys))}")
        return value

    def get(d, key, kinds, where, default=None, optional=False):
        if key not in d:
            if optional:
                return default
            fail(where, f"missing '{key}'")
        v = d[key]
        ok = isinstance(v, kinds) and not (isinstance(v, bool) and bool not in kinds)
        if not ok:
            names = " or ".join(k.__name__ for k in kinds)
            fail(where, f"'{key}' must be {names}, got {v!r}")
        return v

    def integer(v, where, what, low=0, high=2**31 - 1):
        """A whole number in [low, high]: indices and counts are C ints, sizes C size_t."""
        if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
            fail(where, f"{what} must be an integer from {low} to {high}, got {v!r}")
        return v

    obj(data, TOP_KEYS, "top level")
    if get(data, "format", (str,), "top level") != FORMAT:
        fail("top level", f"format {data['format']!r} is not {FORMAT!r}")
    nodes = []
    for i, nd in enumerate(get(data, "nodes", (list,), "top level")):
        where = f"node {i}"
        obj(nd, NODE_KEYS, where)
        kind = get(nd, "kind", (str,), where)
        if kind not in NODE_KINDS:
            fail(where, f"kind {kind!r}: use one of {', '.join(NODE_KINDS)}")
        host = get(nd, "host", (int,), where, optional=True)
        if host is not None:
            integer(host, where, "host")
        nodes.append((get(nd, "name", (str,), where), kind, host))
    ranks = [
        integer(v, f"rank {r}", "its node")
        for r, v in enumerate(get(data, "ranks", (list,), "top level"))
    ]
    links = []
    for i, ld in enumerate(get(data, "links", (list,), "top level")):
        where = f"link {i}"
        obj(ld, LINK_KEYS, where)
        latency = get(ld, "latency_s", (int, float), where)
        bandwidth = get(ld, "bandwidth_Bps", (int, float), where)
        if not (math.isfinite(latency) and latency >= 0):
            fail(where, f"latency_s must be finite and >= 0, got {latency!r}")
        if not (math.isfinite(bandwidth) and bandwidth > 0):
            fail(where, f"bandwidth_Bps must be finite and > 0, got {bandwidth!r}")
        burst = get(ld, "burst_bytes", (int, float), where, 0.0, optional=True)
        if not (math.isfinite(burst) and burst >= 0):
            fail(where, f"burst_bytes must be finite and >= 0, got {burst!r}")
        links.append(
            Link(
                integer(get(ld, "a", (int,), where), where, "a"),
                integer(get(ld, "b", (int,), where), where, "b"),
                float(latency),
                float(bandwidth),
                get(ld, "duplex", (bool,), where, True, optional=True),
                get(ld, "class", (str,), where, "link", optional=True),
                float(burst),
            )
        )
    cpus = []
    for i, cd in enumerate(get(data, "cpus", (list,), "top level", [], optional=True)):
        where = f"CPU pool {i}"
        obj(cd, CPU_KEYS, where)
        members = get(cd, "ranks", (list,), where)
        costs = {}
        for name in ("s_per_b", "s_per_message"):
            cost = get(cd, name, (int, float), where, 0, optional=name == "s_per_message")
            if not (math.isfinite(cost) and cost >= 0):
                fail(where, f"{name} must be finite and >= 0, got {cost!r}")
            costs[name] = float(cost)
        cpus.append(
            CpuPool(
                tuple(integer(r, where, "a rank") for r in members),
                integer(get(cd, "cores", (int,), where), where, "cores", 1),
                **costs,
            )
        )
    step_bytes = integer(
        get(data, "step_bytes", (int,), "top level", _DEFAULT.step_bytes, True),
        "top level",
        "step_bytes",
        1,
        MOST_BYTES,
    )
    slice_bytes = integer(
        get(data, "slice_bytes", (int,), "top level", _DEFAULT.slice_bytes, True),
        "top level",
        "slice_bytes",
        1,
        MOST_BYTES,
    )
    ranks_forward = get(data, "ranks_forward", (bool,), "top level", True, optional=True)
    try:
        return Topology(
            nodes=nodes,
            ranks=ranks,
            links=links,
            cpus=cpus,
            name=get(data, "name", (str,), "top level", "network", optional=True),
            step_bytes=step_bytes,
            slice_bytes=slice_bytes,
            ranks_forward=ranks_forward,
        )
    except TopologyError as e:
        raise TopologyError(f"{source}: {e}") from None
