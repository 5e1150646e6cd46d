"""The tuner's cost model through weft.topo: the choices it must make follow from how many
messages and bytes each family moves, whatever the link figures.

These run in one process (no communicator); the model a communicator measures is covered by
test_algorithms.py (its measured Plans, WEFT_DEBUG's logged choices) and test_bench.py (--tune
files).
"""

from __future__ import annotations

import pytest
from weft import topo

MiB = 1 << 20

# Link figures spanning this VM's loopback and a real network: slow and fast links, cheap and
# dear reductions.
MODELS = {
    "vm-tcp": (topo.LinkCost(alpha_s=27e-6, beta_s_per_b=1 / 0.5e9), 1 / 18e9),
    "vm-shm": (topo.LinkCost(alpha_s=8e-6, beta_s_per_b=1 / 1e9), 1 / 18e9),
    "100g": (topo.LinkCost(alpha_s=5e-6, beta_s_per_b=1 / 12.5e9), 1 / 10e9),
}


def model(name: str) -> topo.CostModel:
    link, gamma = MODELS[name]
    m = topo.CostModel()
    m.tcp = link
    m.shm = link
    m.gamma_s_per_b = gamma
    return m


def flat(size: int) -> topo.Topology:
    return topo.Topology(size=size, hosts=1, ranks_per_host=size, any_tcp=True)


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("size", [4, 8, 16, 64])
def test_small_messages_take_recursive_doubling(name, size):
    # log2(n) messages, the fewest of any family, and bytes that do not matter yet.
    assert topo.choose("allreduce", 8, flat(size), model(name))[0] == "rd"


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("size", [4, 8, 16])
def test_middle_sizes_on_a_power_of_two_take_halving_doubling(name, size):
    # rhd sends 2(p-1)/p of the buffer per rank in 2 log2(p) messages; the double binary tree
    # sends twice the buffer, the ring as much as rhd in 2(p - 1) steps.
    choice, predicted = topo.choose("allreduce", 256 << 10, flat(size), model(name))
    assert choice == "rhd"
    assert predicted < topo.predict("ring", "allreduce", 256 << 10, flat(size), model(name))


@pytest.mark.parametrize("name", ["vm-tcp", "vm-shm"])
@pytest.mark.parametrize("size", [4, 8, 16])
def test_the_largest_take_the_ring(name, size):
    # In steps of several messages the ring's steps overlap, each rank's link carrying one
    # step's messages after the other's: its latencies hide behind its bytes, where rhd pays
    # 2 log2(p) of them for each round of a Plan step's budget per rank (measured on 4 and 8
    # ranks over tcp: bench/results/algos_tcp_np4.txt, algos_tcp_np8.txt). Both stay below the
    # double tree, which sends twice the buffer.
    choice, predicted = topo.choose("allreduce", 256 * MiB, flat(size), model(name))
    assert choice == "ring"
    assert predicted < topo.predict("tree", "allreduce", 256 * MiB, flat(size), model(name))


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("size", [3, 5, 6, 7, 9])
def test_large_messages_off_a_power_of_two_avoid_the_fold(name, size):
    # Off a power of two, rd and rhd first fold the extra ranks in with a whole-buffer message.
    choice, _ = topo.choose("allreduce", 256 * MiB, flat(size), model(name))
    assert choice in ("ring", "tree")


@pytest.mark.parametrize("name", MODELS)
def test_tree_moves_twice_the_buffer_per_rank(name):
    # The double binary tree's bandwidth term: 2 S beta + S gamma, whatever the world size.
    m = model(name)
    for size in (4, 8, 64):
        per_byte = [
            topo.predict("tree", "allreduce", s, flat(size), m) / s for s in (1 << 30, 1 << 31)
        ]
        expected = 2 * m.tcp.beta_s_per_b + m.gamma_s_per_b
        assert per_byte[1] == pytest.approx(expected, rel=0.01)


@pytest.mark.parametrize("size,levels", [(2, 1), (5, 1), (8, 2), (21, 2), (22, 3), (64, 3)])
def test_small_buffers_take_one_wide_tree(size, levels):
    # Under 16 KiB one tree of up to 4 children per rank: a latency up and one down per level.
    m = model("vm-tcp")
    alpha = m.tcp.alpha_s
    assert topo.predict("tree", "allreduce", 0, flat(size), m) == pytest.approx(2 * levels * alpha)


def test_hierarchical_wins_across_slow_host_links():
    # 2 hosts x 2 ranks, shared memory inside a host and a 1 Gbit/s link between them: every
    # flat family pushes ranks_per_host times more bytes over the host's link than hier.
    m = topo.CostModel()
    m.shm = topo.LinkCost(alpha_s=8e-6, beta_s_per_b=1 / 5e9)
    m.tcp = topo.LinkCost(alpha_s=50e-6, beta_s_per_b=1 / 0.125e9)
    world = topo.Topology(size=4, hosts=2, ranks_per_host=2, any_tcp=True)
    assert "hier" in topo.algorithms_for("allreduce", world)
    assert topo.choose("allreduce", 64 * MiB, world, m)[0] == "hier"


@pytest.mark.parametrize(("hosts", "link_latencies"), [(8, 6), (6, 10), (16, 8)])
def test_hier_prices_the_steps_its_shards_take_across_the_hosts(hosts, link_latencies):
    # Empty shards cost latencies alone: 2 shm steps inside a host of 2, and across the hosts
    # 2 log2(hosts) by halving and doubling where they are a power of two, 2 (hosts - 1) around
    # a ring otherwise (tests/test_topo_check.py checks the Plans take those steps).
    m = topo.CostModel()
    m.shm = topo.LinkCost(alpha_s=2e-6, beta_s_per_b=1 / 8e9)
    m.tcp = topo.LinkCost(alpha_s=40e-6, beta_s_per_b=1 / 0.125e9)
    world = topo.Topology(size=2 * hosts, hosts=hosts, ranks_per_host=2)
    assert topo.predict("hier", "allreduce", 0, world, m) == pytest.approx(
        2 * m.shm.alpha_s + link_latencies * m.tcp.alpha_s
    )


def test_recursive_doubling_pays_shared_memory_inside_a_host():
    # 2 hosts x 2 ranks numbered host by host: rd's first round pairs ranks of one host (shm),
    # its second crosses (tcp). hier also sends one tcp message between two hosts (an exchange
    # for small shards) but takes two shm steps to rd's one, so the smallest messages take rd.
    m = topo.CostModel()
    m.shm = topo.LinkCost(alpha_s=2e-6, beta_s_per_b=1 / 8e9)
    m.tcp = topo.LinkCost(alpha_s=40e-6, beta_s_per_b=1 / 0.125e9)
    world = topo.Topology(size=4, hosts=2, ranks_per_host=2)
    interleaved = topo.Topology(size=4, hosts=2, ranks_per_host=2, ranks_by_host=False)
    assert world.ranks_by_host and not interleaved.ranks_by_host
    rd = topo.predict("rd", "allreduce", 8, world, m)
    assert rd == pytest.approx(m.shm.alpha_s + m.tcp.alpha_s, rel=0.01)
    # Numbered otherwise, both rounds may cross hosts.
    assert topo.predict("rd", "allreduce", 8, interleaved, m) == pytest.approx(
        2 * m.tcp.alpha_s, rel=0.01
    )
    assert topo.choose("allreduce", 8, world, m)[0] == "rd"
    assert topo.predict("hier", "allreduce", 8, world, m) == pytest.approx(
        2 * m.shm.alpha_s + m.tcp.alpha_s, rel=0.01
    )
    assert topo.choose("allreduce", 64 * MiB, world, m)[0] == "hier"


@pytest.mark.parametrize("collective", ["broadcast", "reduce"])
@pytest.mark.parametrize("size", [3, 4, 8])
def test_a_chain_pipelines_whole_slices_only(collective, size):
    # A chain forwards a message once all of it arrived: a buffer of one slice crosses the n-1
    # links one after another, so the binomial tree (log2 n messages) is never dearer there;
    # many slices pipeline, and the chain's time approaches one pass of the buffer.
    m, world = model("vm-shm"), flat(size)
    alpha, beta = m.shm.alpha_s, m.shm.beta_s_per_b
    one_slice = world.slice_bytes
    chain = topo.predict("chain", collective, one_slice, world, m)
    gamma = one_slice * m.gamma_s_per_b if collective == "reduce" else 0
    assert chain == pytest.approx((size - 1) * (alpha + one_slice * beta + gamma))
    assert topo.predict("tree", collective, one_slice, world, m) <= chain
    assert topo.choose(collective, 64 << 10, world, m)[0] == "tree"
    many = 256 * one_slice
    assert topo.choose(collective, many, world, m)[0] == "chain"
    # Smaller slices pipeline sooner.
    fine = topo.Topology(size=size, any_tcp=True, slice_bytes=one_slice // 4)
    assert topo.predict("chain", collective, one_slice, fine, m) < chain
    with pytest.raises(ValueError, match="slice_bytes"):
        topo.Topology(size=size, slice_bytes=0)


def test_families_without_a_form_are_not_offered():
    # rhd's reduce-scatter and allgather need a power of two; hier needs several hosts.
    assert "rhd" in topo.algorithms_for("reduce_scatter", flat(8))
    assert "rhd" not in topo.algorithms_for("reduce_scatter", flat(6))
    assert "hier" not in topo.algorithms_for("allreduce", flat(8))
    assert topo.choose("reduce_scatter", 256 * MiB, flat(6))[0] == "ring"
    with pytest.raises(ValueError, match="rhd has no reduce_scatter"):
        topo.predict("rhd", "reduce_scatter", 8, flat(6))


def test_unknown_names_are_refused_with_the_choices():
    with pytest.raises(ValueError, match="use auto, ring, tree"):
        topo.predict("butterfly", "allreduce", 8, flat(4))
    with pytest.raises(ValueError, match="use allreduce, reduce_scatter"):
        topo.choose("allsum", 8, flat(4))


def test_hier_in_pieces_prices_its_host_phases_beside_the_link():
    # A buffer of many rounds goes through hier in pieces, its shared-memory phases running
    # while the link carries the neighbouring pieces: cheaper than the phases one after another.
    # A buffer of one round is one piece, priced the same either way.
    m = topo.CostModel()
    m.shm = topo.LinkCost(alpha_s=2e-6, beta_s_per_b=1 / 8e9)
    m.tcp = topo.LinkCost(alpha_s=20e-6, beta_s_per_b=1 / 10e9)
    pieces = topo.Topology(size=8, hosts=2, ranks_per_host=4)
    one_piece = topo.Topology(size=8, hosts=2, ranks_per_host=4, step_bytes=1 << 40)
    assert pieces.step_bytes == 512 << 10
    whole = topo.predict("hier", "allreduce", 256 * MiB, one_piece, m)
    piecewise = topo.predict("hier", "allreduce", 256 * MiB, pieces, m)
    assert piecewise < 0.8 * whole
    small = 1 * MiB  # less than one round: 2 hosts x 4 ranks x 512 KiB
    assert topo.predict("hier", "allreduce", small, pieces, m) == topo.predict(
        "hier", "allreduce", small, one_piece, m
    )


def test_measured_plans_outrank_the_link_figures():
    # Where a world timed whole Plans, the tuner believes the timings: the measured figure at
    # and below the smallest size measured, the line between sizes, and above the largest the
    # figure plus what the model adds from there. Unmeasured families keep the model's figure.
    m, t = model("vm-tcp"), flat(4)
    assert topo.choose("allreduce", 64, t, m)[0] == "rd"
    m.measured = [
        ("allreduce", "rd", 64, 50e-6),
        ("allreduce", "rd", 4096, 90e-6),
        ("allreduce", "ring", 64, 30e-6),
        ("allreduce", "ring", 4096, 130e-6),
    ]
    assert m.measured[0] == ("allreduce", "rd", 64, 50e-6)
    assert topo.choose("allreduce", 64, t, m) == ("ring", 30e-6)
    assert topo.choose("allreduce", 8, t, m) == ("ring", 30e-6)
    algo, seconds = topo.choose("allreduce", 1024, t, m)
    assert algo == "ring"
    assert seconds == pytest.approx(30e-6 + (1024 - 64) / (4096 - 64) * 100e-6)
    assert topo.choose("allreduce", 3000, t, m)[0] == "rd"  # the lines cross at 1/3
    algo, seconds = topo.choose("allreduce", 6000, t, m)
    grown = topo.predict("rd", "allreduce", 6000, t, m) - topo.predict(
        "rd", "allreduce", 4096, t, m
    )
    assert (algo, seconds) == ("rd", pytest.approx(90e-6 + grown))
    # Too dear everywhere: the unmeasured families win, priced by the model alone.
    m.measured = [(c, a, b, 1.0) for c, a, b, _ in m.measured]
    algo, seconds = topo.choose("allreduce", 64, t, m)
    assert algo not in ("rd", "ring")
    assert seconds == topo.predict(algo, "allreduce", 64, t, m)


def test_measured_plans_are_comments_in_a_saved_model(tmp_path):
    # They hold for the world they were measured on only: a file keeps the link figures.
    m = model("vm-shm")
    m.measured = [("broadcast", "chain", 4096, 3e-5)]
    path = tmp_path / "model.txt"
    topo.save_cost_model(m, str(path))
    assert "# measured broadcast chain 4096 B: 3e-05 s" in path.read_text()
    loaded = topo.load_cost_model(str(path))
    assert loaded.measured == []
    assert loaded.shm.alpha_s == m.shm.alpha_s


def large_buffer_model() -> topo.CostModel:
    m = model("vm-shm")
    m.tcp = topo.LinkCost(alpha_s=20e-6, beta_s_per_b=1e-9, beta_large_s_per_b=2e-9)
    m.small_bytes, m.large_bytes = 4 << 20, 64 << 20
    return m


def test_large_buffer_betas_hold_from_large_bytes_and_meet_in_log2_between():
    m = large_buffer_model()
    beta = {n: topo.at_buffer(m, n).tcp.beta_s_per_b for n in (1 << 20, 16 << 20, 1 << 30)}
    assert beta == {1 << 20: 1e-9, 16 << 20: pytest.approx(1.5e-9), 1 << 30: 2e-9}
    assert topo.at_buffer(m, 1 << 30).shm.beta_s_per_b == m.shm.beta_s_per_b  # none measured
    # predict prices a call at its size: at 64 MiB and more, as if beta were beta_large.
    flat = topo.Topology(size=4, hosts=4, any_tcp=True)
    slow = large_buffer_model()
    slow.tcp = topo.LinkCost(alpha_s=20e-6, beta_s_per_b=2e-9)
    slow.small_bytes = slow.large_bytes = 0
    for family in ("ring", "rhd", "tree"):
        assert topo.predict(family, "allreduce", 64 << 20, flat, m) == pytest.approx(
            topo.predict(family, "allreduce", 64 << 20, flat, slow)
        )
        assert topo.predict(family, "allreduce", 1 << 20, flat, m) < topo.predict(
            family, "allreduce", 1 << 20, flat, slow
        )


def test_large_buffer_betas_survive_a_file_and_bad_ones_are_refused(tmp_path):
    path = tmp_path / "model.txt"
    topo.save_cost_model(large_buffer_model(), str(path))
    text = path.read_text()
    assert "large_bytes 67108864" in text and "tcp_beta_large_s_per_b 2e-09" in text
    loaded = topo.load_cost_model(str(path))
    assert (loaded.small_bytes, loaded.large_bytes) == (4 << 20, 64 << 20)
    assert loaded.tcp.beta_large_s_per_b == 2e-9
    # A file without them (older, or from the quick probe) holds one beta per link.
    path.write_text("\n".join(line for line in text.splitlines() if "large" not in line))
    assert topo.load_cost_model(str(path)).large_bytes == 0
    for bad, message in (
        ("large_bytes 1048576", "large_bytes must be more than small_bytes"),
        ("large_bytes 67108864.5", "large_bytes must be a whole number of bytes"),
        ("tcp_beta_large_s_per_b -1", "tcp_beta_large_s_per_b must be 0"),
    ):
        path.write_text(text + bad + "\n")
        with pytest.raises(ValueError, match=message):
            topo.load_cost_model(str(path))


# Which recursive-doubling worlds end some rank's rounds in Scratch, so that it copies its
# result out: (in place, out of place). Its rounds alternate buffers, starting from Input
# (Output for ranks that took a folded partner's input), and may not write Input in place.
RD_COPIES = {
    2: (True, False),
    3: (True, True),
    4: (False, True),
    5: (False, True),
    6: (False, True),
    7: (False, True),
    8: (True, False),
    9: (True, True),
}


@pytest.mark.parametrize("size", RD_COPIES)
def test_in_place_prices_the_copies_of_families_that_keep_their_input(size):
    # A local copy costs half a shared-memory message of the buffer (a copy in and one out). On
    # flat(), messages cross tcp links, so a model whose shared memory costs nothing prices the
    # same Plans without their copies.
    m, no_copies = model("vm-shm"), model("vm-shm")
    no_copies.shm = topo.LinkCost(alpha_s=m.shm.alpha_s, beta_s_per_b=0)
    world = flat(size)

    def copies(family, nbytes, in_place):
        price, without = (
            topo.predict(family, "allreduce", nbytes, world, model_, in_place=in_place)
            for model_ in (m, no_copies)
        )
        return round((price - without) / (nbytes * m.shm.beta_s_per_b / 2), 6)

    for in_place, expected in zip((True, False), RD_COPIES[size]):
        assert copies("rd", 64 * MiB, in_place) == expected
    # oneshot stages every contribution (2 copies' worth) except on two ranks out of place, and
    # on two ranks in place below a step (its input is sent before the peer's is reduced into
    # it; the step is a power of two, so a trial range of sizes runs one form).
    step = world.step_bytes
    for nbytes in (step // 2, step - 4, step, 64 * MiB):
        stages = size > 2 or nbytes >= step
        assert copies("oneshot", nbytes, True) == (2 if stages else 0)
        assert copies("oneshot", nbytes, False) == (2 if size > 2 else 0)
    for family in ("ring", "rhd", "tree"):
        assert copies(family, 64 * MiB, True) == copies(family, 64 * MiB, False) == 0
