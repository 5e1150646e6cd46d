"""weft.topo.Topology as a network: builders, routes, JSON, calibration, and the closed form."""

import json

import pytest
from weft import topo
from weft.topo import Topology, TopologyError


def test_builders_work_with_defaults_in_one_call():
    ring = Topology.ring(4096)
    assert (ring.size, len(ring.links)) == (4096, 4096)
    assert len(Topology.fully_connected(7).links) == 21
    assert len(Topology.switch(5).links) == 5
    torus = Topology.torus((32, 32))
    assert (torus.size, len(torus.links)) == (1024, 2048)
    assert Topology.torus((4, 2, 3)).size == 24
    hosts = Topology.hosts(4, 8)
    assert (hosts.size, hosts.hosts, hosts.ranks_per_host, hosts.any_tcp) == (32, 4, 8, True)
    assert Topology.fat_tree().size == 64
    assert Topology.rail_optimized().size == 32
    kinds = {k for _, k, _ in hosts.nodes}
    assert kinds == {"rank", "nic", "switch"}
    # Every builder takes ranks_forward: the same network, whose ranks pass on nothing.
    for build in (
        lambda **kw: Topology.ring(4096, **kw),
        lambda **kw: Topology.fully_connected(7, **kw),
        lambda **kw: Topology.switch(5, **kw),
        lambda **kw: Topology.torus((32, 32), **kw),
        lambda **kw: Topology.hosts(4, 8, **kw),
        lambda **kw: Topology.fat_tree(**kw),
        lambda **kw: Topology.rail_optimized(**kw),
        lambda **kw: Topology.from_cost_model(**kw),
    ):
        direct, forwarding = build(ranks_forward=False), build()
        assert (direct.ranks_forward, forwarding.ranks_forward) == (False, True)
        assert direct.links == forwarding.links and direct.name == forwarding.name


def test_routes_are_shortest_and_deterministic():
    ring = Topology.ring(10)
    assert ring.route(0, 3) == ["rank0", "rank1", "rank2", "rank3"]
    assert ring.route(0, 8) == ["rank0", "rank9", "rank8"]  # the short way round
    assert ring.route(4, 4) == ["rank4"]
    torus = Topology.torus((8, 8))
    for a, b in ((0, 63), (9, 54), (7, 56)):
        ax, ay, bx, by = a // 8, a % 8, b // 8, b % 8
        dist = min(abs(ax - bx), 8 - abs(ax - bx)) + min(abs(ay - by), 8 - abs(ay - by))
        assert len(torus.route(a, b)) == dist + 1
        assert torus.route(a, b) == torus.route(a, b)
    hosts = Topology.hosts(3, 4)
    assert hosts.route(0, 3) == ["host0.rank0", "host0.nvswitch", "host0.rank3"]
    assert hosts.route(1, 9) == [
        "host0.rank1",
        "host0.nvswitch",
        "host0.nic0",
        "switch",
        "host2.nic0",
        "host2.nvswitch",
        "host2.rank1",
    ]
    # A rail-optimized world crosses hosts on the rail of the local index.
    rail = Topology.rail_optimized(4, 4)
    assert rail.route(1, 13) == ["host0.rank1", "host0.nic1", "rail1", "host3.nic1", "host3.rank1"]


def test_fat_tree_spreads_routes_over_spines():
    tree = Topology.fat_tree(64, per_leaf=8)
    spines = {tree.route(a, b)[2] for a in range(8) for b in range(56, 64)}
    assert all(len(tree.route(a, 63)) == 5 for a in range(8))
    assert len(spines) >= 4  # equal paths spread by the ranks' hash, not all on spine0


def test_no_route_is_none():
    t = Topology(
        nodes=[("a", "rank", None), ("b", "rank", None), ("c", "rank", None)],
        ranks=[0, 1, 2],
        links=[topo.Link(0, 1, 1e-6, 1e9)],
    )
    assert t.route(0, 1) == ["a", "b"]
    assert t.route(0, 2) is None


def test_closed_form_still_works_and_a_network_feeds_it():
    closed = Topology(size=8, hosts=2)
    assert (closed.size, closed.hosts, closed.ranks_per_host) == (8, 2, 4)
    net = Topology.hosts(2, 4)
    for family in topo.algorithms_for("allreduce", closed):
        assert topo.predict(family, "allreduce", 1 << 20, net) == topo.predict(
            family, "allreduce", 1 << 20, closed
        )
    assert topo.choose("allreduce", 1 << 20, net) == topo.choose("allreduce", 1 << 20, closed)
    # A closed-form world simulates on the hosts network of the default figures.
    assert closed.route(0, 5)[1] == "host0.nvswitch"
    with pytest.raises(TopologyError, match="size="):
        Topology()


def test_json_round_trip(tmp_path):
    buckets = Topology.hosts(2, 2, nic=(5e-6, 1.25e8, 256 << 10)).sharing_cpus(2, 1e-10, 2e-6)
    assert {x.burst_bytes for x in buckets.links if x.cls == "nic"} == {256 << 10}
    for t in (
        Topology.hosts(2, 3),
        Topology.torus((3, 3)),
        Topology.fat_tree(8, per_leaf=4),
        buckets,
        Topology.ring(5, ranks_forward=False),
        Topology.switch(3, ranks_forward=False),
        Topology.fat_tree(8, per_leaf=4, ranks_forward=False),
        Topology.hosts(2, 3, ranks_forward=False),
        Topology.rail_optimized(2, 2, ranks_forward=False),
        Topology.from_cost_model(None, 2, 2, ranks_forward=False),
    ):
        path = tmp_path / "t.json"
        t.save(path)
        back = Topology.load(path)
        assert back.to_json() == t.to_json()
        assert (back.size, back.hosts) == (t.size, t.hosts)
        assert back.route(0, t.size - 1) == t.route(0, t.size - 1)
        assert back.ranks_forward == t.ranks_forward


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d.update(colour=1), "top level: unknown key"),
        (lambda d: d["links"][2].update(speed=1), "link 2: unknown key"),
        (lambda d: d["links"][1].update(latency_s=-1.0), "link 1: latency_s"),
        (lambda d: d["links"][0].update(bandwidth_Bps="fast"), "link 0: 'bandwidth_Bps' must be"),
        (lambda d: d["links"][0].update(a=99), "link 0 joins nodes 99"),
        (lambda d: d["links"][0].update(duplex=1), "link 0: 'duplex' must be bool"),
        (lambda d: d["nodes"][3].update(kind="router"), "node 3: kind 'router'"),
        (lambda d: d["nodes"][0].pop("name"), "node 0: missing 'name'"),
        (lambda d: d["ranks"].__setitem__(1, True), "rank 1: its node must be an integer"),
        (lambda d: d["ranks"].__setitem__(1, d["ranks"][0]), "two ranks sit on one node"),
        (lambda d: d.update(format="x"), "format 'x'"),
        (lambda d: d["links"][0].update(burst_bytes=-1), "link 0: burst_bytes must be"),
        (lambda d: d.update(slice_bytes=10**40), "slice_bytes must be an integer from 1 to"),
        (lambda d: d["nodes"][0].update(host=2**40), "node 0: host must be an integer from 0"),
        (lambda d: d.update(cpus=[{"ranks": [0], "cores": 0, "s_per_b": 1e-9}]), "cores must"),
        (lambda d: d.update(cpus=[{"ranks": [0], "cores": 1}]), "CPU pool 0: missing 's_per_b'"),
        (lambda d: d.update(cpus=[{"ranks": [9], "cores": 1, "s_per_b": 0}]), "names rank 9"),
        (lambda d: d.update(cpus=[{"ranks": [0], "cores": 1, "s_per_b": -1}]), "s_per_b must"),
        (
            lambda d: d.update(
                cpus=[{"ranks": [0], "cores": 1, "s_per_b": 0, "s_per_message": -1}]
            ),
            "s_per_message must",
        ),
        (lambda d: d.update(ranks_forward="no"), "top level: 'ranks_forward' must be bool"),
    ],
)
def test_json_refuses_what_it_does_not_know(tmp_path, edit, message):
    data = Topology.hosts(2, 2).to_json()
    edit(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(TopologyError, match=message):
        Topology.load(path)


def test_calibration_from_a_cost_model(tmp_path):
    model = topo.CostModel()
    model.shm = topo.LinkCost(3e-6, 1 / 20e9)
    model.tcp = topo.LinkCost(40e-6, 1 / 1e9)
    model.gamma_s_per_b = 1 / 5e9

    def end_to_end(t, a, b):
        links = [t.links[i] for i, _ in t.route_links(a, b)]
        return sum(x.latency_s for x in links), min(x.bandwidth_Bps for x in links)

    for source in (model, tmp_path / "tune.txt"):
        if not isinstance(source, topo.CostModel):
            topo.save_cost_model(model, str(source))
        t = Topology.from_cost_model(source, 2, 2)
        assert end_to_end(t, 0, 1) == pytest.approx((3e-6, 20e9))
        assert end_to_end(t, 0, 3) == pytest.approx((40e-6, 1e9))
        assert t.gamma_s_per_b == pytest.approx(1 / 5e9)
    assert Topology.from_cost_model().size == 2
    assert t.at_buffer(64 << 20) is t  # one beta per link: the same at every size
    with pytest.raises(TopologyError, match="CostModel or a path"):
        Topology.from_cost_model(3)
    # With large-buffer betas, simulate runs a call on the links at its size.
    model.tcp = topo.LinkCost(40e-6, 1 / 1e9, 1 / 0.5e9)
    model.small_bytes, model.large_bytes = 4 << 20, 64 << 20
    t = Topology.from_cost_model(model, 2, 2)
    assert end_to_end(t, 0, 3) == pytest.approx((40e-6, 1e9))
    assert end_to_end(t.at_buffer(1 << 30), 0, 3) == pytest.approx((40e-6, 0.5e9))
    assert (
        not Topology.from_cost_model(model, 2, 2, ranks_forward=False)
        .at_buffer(1 << 30)
        .ranks_forward
    )
    slow = topo.CostModel()
    slow.shm, slow.tcp, slow.gamma_s_per_b = model.shm, topo.LinkCost(40e-6, 1 / 0.5e9), 1 / 5e9
    at_large = Topology.from_cost_model(slow, 2, 2)
    for nbytes in (64 << 20, 1 << 20):
        seconds = topo.simulate("ring", t, nbytes).time_s
        as_if_slow = topo.simulate("ring", at_large, nbytes).time_s
        assert seconds == pytest.approx(as_if_slow) if nbytes >= 64 << 20 else seconds < as_if_slow
    # Local ranks sharing a machine's cores: the probe's alpha and beta are what each got with
    # all of them exchanging at once; on a core of its own a message takes cores / ranks of that.
    shared = Topology.from_cost_model(model, 4, 1, machine_cores=2)
    (pool,) = shared.graph.cpus
    assert (pool.ranks, pool.cores) == ((0, 1, 2, 3), 2)
    assert pool.s_per_b == pytest.approx(2 / 4 / 1e9)
    assert pool.s_per_message == pytest.approx(2 / 4 * 40e-6)
    assert end_to_end(shared, 0, 3) == pytest.approx((40e-6, 2e9))
    (large,) = shared.at_buffer(1 << 30).graph.cpus  # the large-buffer beta's share
    assert large.s_per_b == pytest.approx(2 / 4 / 0.5e9)
    with pytest.raises(TopologyError, match="one machine's ranks talk over one transport"):
        Topology.from_cost_model(slow, 2, 2, machine_cores=2)
    tbf = Topology.from_cost_model(slow, 2, 2, nic_burst_bytes=1 << 18)
    assert {x.burst_bytes for x in tbf.links if x.cls == "nic"} == {1 << 18}
    faster = Topology.hosts(2, 2).with_class("nic", bandwidth_Bps=1e12)
    assert {x.bandwidth_Bps for x in faster.links if x.cls == "nic"} == {1e12}
    with pytest.raises(TopologyError, match="no links of class 'warp'"):
        faster.with_class("warp", 1.0)


def test_builders_refuse_bad_shapes():
    for build, message in (
        (lambda: Topology.ring(0), "ring needs n >= 1"),
        (lambda: Topology.torus((3, 0)), "torus needs dims"),
        (lambda: Topology.hosts(2, 0), "per_host >= 1"),
        (lambda: Topology.fully_connected(5000), "n <= 1024"),
    ):
        with pytest.raises(TopologyError, match=message):
            build()


def test_check_reports_messages_the_topology_cannot_carry():
    ring = topo.builtin("allreduce", "ring", 4, count=8)
    assert topo.check(ring, topology=Topology.ring(4)).ok
    split = Topology(
        nodes=[(f"r{r}", "rank", None) for r in range(4)],
        ranks=[0, 1, 2, 3],
        links=[topo.Link(0, 1, 1e-6, 1e9), topo.Link(2, 3, 1e-6, 1e9)],
        name="two pairs",
    )
    report = topo.check(ring, topology=split)
    assert not report.ok
    first = report.errors[0]  # rank 0 receives from rank 3 in its second step
    assert (first.rank, first.channel, first.step) == (0, 0, 1)
    assert "receives from rank 3, but the topology (two pairs) has no route from rank 3" in str(
        first
    )
    assert any(
        (e.rank, e.step) == (1, 0) and "sends to rank 2" in str(e) and "rank 1 channel 0" in str(e)
        for e in report.errors
    )
    assert any("receives from rank 1" in str(e) and e.rank == 2 for e in report.errors)
    assert "has 5 ranks, the algorithm 4" in str(topo.check(ring, topology=Topology.ring(5)))


def test_ranks_that_do_not_forward_refuse_routes_through_other_ranks():
    """Where ranks do not forward (GPUs on direct links), a message may cross switches and NICs
    but no other rank: recursive doubling's distance-2 exchange on a ring is refused naming the
    rank between, the ring passes, and a switch is no relay. ``direct_only`` checks any topology
    so."""
    rd = topo.builtin("allreduce", "rd", 4, count=8)
    assert topo.check(rd, topology=Topology.ring(4)).ok  # routed through rank 1: allowed
    direct = Topology.ring(4, ranks_forward=False)
    assert "ranks do not forward" in repr(direct)
    assert direct.route(0, 2) is None and direct.route_links(0, 2) is None
    assert direct.route(0, 1) == ["rank0", "rank1"]
    for report in (
        topo.check(rd, topology=direct),
        topo.check(rd, topology=Topology.ring(4), direct_only=True),
    ):
        assert not report.ok
        first = report.errors[0]
        assert (first.rank, first.step) == (0, 1), first
        assert (
            "sends to rank 2, but the topology (ring(4)) joins rank 0 to rank 2 only through "
            "rank1, another rank's node, and ranks do not forward"
        ) in str(first)
    ring = topo.builtin("allreduce", "ring", 4, count=8)
    assert topo.check(ring, topology=direct).ok
    assert topo.check(rd, topology=Topology.switch(4), direct_only=True).ok
    eight = topo.builtin("allreduce", "rd", 8, count=8)
    assert topo.check(eight, topology=Topology.hosts(2, 4), direct_only=True).ok
    torus = topo.builtin("allreduce", "rd", 16, count=16)
    assert not topo.check(torus, topology=Topology.torus((4, 4), ranks_forward=False)).ok
    assert not topo.check(torus, topology=Topology.torus((4, 4)), direct_only=True).ok


def test_routes_around_ranks_take_switches():
    """Ranks a - b - c in a line, and a - sw0 - sw1 - c: with forwarding the shorter route
    through b, without it the one through the switches; d, reached only through b, has none."""
    names = [("a", "rank"), ("b", "rank"), ("c", "rank"), ("sw0", "switch"), ("sw1", "switch")]
    nodes = [(name, kind, None) for name, kind in names + [("d", "rank")]]
    pairs = [(0, 1), (1, 2), (0, 3), (3, 4), (4, 2), (1, 5)]
    links = [topo.Link(x, y, 1e-6, 1e9) for x, y in pairs]
    t = Topology(nodes=nodes, ranks=[0, 1, 2, 5], links=links)
    assert (t.route(0, 2), t.route(0, 3)) == (["a", "b", "c"], ["a", "b", "d"])
    direct = t.with_ranks_forward(False)
    assert direct.route(0, 2) == ["a", "sw0", "sw1", "c"]
    assert direct.route_links(0, 2) == [(2, 0), (3, 0), (4, 0)]
    assert direct.route(0, 3) is None
    assert direct.route_fault(0, 3) == (
        "joins rank 0 to rank 3 only through b, another rank's node, and ranks do not forward"
    )
    assert direct.route_fault(0, 2) is None and t.route_fault(0, 3) is None


# Each command-line builder on 6 ranks, and the same network built with ranks_forward=False.
NO_FORWARD = {
    "ring:6": lambda: Topology.ring(6, ranks_forward=False),
    "full:6": lambda: Topology.fully_connected(6, ranks_forward=False),
    "switch:6": lambda: Topology.switch(6, ranks_forward=False),
    "fat_tree:6x2": lambda: Topology.fat_tree(6, 2, ranks_forward=False),
    "torus:6": lambda: Topology.torus((6,), ranks_forward=False),
    "hosts:2x3": lambda: Topology.hosts(2, 3, ranks_forward=False),
    "rail:2x3": lambda: Topology.rail_optimized(2, 3, ranks_forward=False),
}


def test_every_builder_has_ranks_that_do_not_forward():
    """``:noforward`` after any command-line builder is that builder's ranks_forward=False; a
    ring passes the checker and simulates on each, as fast as where ranks forward unless routes
    went through them: rail_optimized's GPUs then cross to another rail over the spine."""
    from weft.topo.__main__ import BUILDERS, topology_arg

    assert {spec.partition(":")[0] for spec in NO_FORWARD} == set(BUILDERS)
    ring = topo.builtin("allreduce", "ring", 6, count=6)
    for spec, build in NO_FORWARD.items():
        direct = build()
        assert topology_arg(f"{spec}:noforward").to_json() == direct.to_json()
        assert topo.check(ring, topology=direct).ok, spec
        seconds = topo.simulate(ring, direct, 1 << 16).time_s
        forwarding = topo.simulate(ring, direct.with_ranks_forward(True), 1 << 16).time_s
        assert seconds == forwarding if spec != "rail:2x3" else seconds > forwarding, spec
    rail = NO_FORWARD["rail:2x3"]()
    assert rail.with_ranks_forward(True).route(0, 4)[2] == "host0.rank1"
    assert rail.route(0, 4) == [
        "host0.rank0",
        "host0.nic0",
        "rail0",
        "spine",
        "rail1",
        "host1.nic1",
        "host1.rank1",
    ]


def test_direct_only_from_the_command_line(tmp_path, capsys):
    from weft.topo.__main__ import main

    path = tmp_path / "rd4.json"
    topo.builtin("allreduce", "rd", 4, count=8).save(path)
    assert main(["check", str(path), "--topology", "ring:4"]) == 0
    assert main(["check", str(path), "--topology", "ring:4", "--direct-only"]) == 1
    assert "only through rank1, another rank's node" in capsys.readouterr().out
    assert main(["check", str(path), "--topology", "ring:4:noforward"]) == 1
    assert "only through rank1, another rank's node" in capsys.readouterr().out
    assert main(["simulate", str(path), "--topology", "ring:4:noforward"]) == 1
    assert "simulate: rd: the topology (ring(4)) joins rank 0" in capsys.readouterr().err
    saved = tmp_path / "ring4.json"
    Topology.ring(4, ranks_forward=False).save(saved)
    assert main(["check", str(path), "--topology", str(saved)]) == 1
