"""weft.topo's Algorithms and checker: every built-in Plan passes the checker on 1 to 33 ranks,
and seeded bugs (a dropped send, a doubled reduction, a swapped chunk, ranks waiting on each
other, too little buffering, memory overwritten while a send by reference is unread) are caught
with errors that name where they are. No processes: the checker runs the Plans symbolically."""

from __future__ import annotations

import json
import time

import pytest
from weft import topo
from weft._C.topo import Topology as Shape
from weft.topo import Span, Step
from weft.topo.algorithm import ROOTED
from weft.topo.builtin import TUNED, host_layout
from weft.topo.check import MODELLED_ELEMENTS

WORLDS = range(1, 34)
IN_PLACE = ("allreduce", "reduce", "allgather", "reduce_scatter")
AVG = ("allreduce", "reduce_scatter", "reduce")
# (count, slot_bytes, slots): one slice per step, nothing, one element, and many small slices
# through two slots, so that finite buffering and slicing both show.
SHAPES = ((5, 256 << 10, 8), (0, 256 << 10, 8), (1, 256 << 10, 8), (7, 8, 2))


def variants(collective: str, family: str, ranks: int, hosts):
    for in_place in (False, True) if collective in IN_PLACE else (False,):
        for avg in (False, True) if collective in AVG else (False,):
            for count, slot_bytes, slots in SHAPES:
                yield dict(
                    count=count,
                    in_place=in_place,
                    avg=avg,
                    hosts=hosts,
                    root=ranks // 2 if collective in ROOTED else 0,
                    slot_bytes=slot_bytes,
                    slots=slots,
                )


@pytest.mark.parametrize("collective", list(topo.FAMILIES))
def test_every_builtin_passes_the_checker_on_1_to_33_ranks(collective):
    checked, failures = 0, []
    for family in topo.FAMILIES[collective]:
        for ranks in WORLDS:
            hosts = 2 if family == "hier" and ranks % 2 == 0 else None
            world = Shape.of_hosts(host_layout(ranks, hosts))
            if collective in TUNED and family not in topo.algorithms_for(collective, world):
                continue
            for options in variants(collective, family, ranks, hosts):
                report = topo.check(topo.builtin(collective, family, ranks, **options))
                checked += 1
                if not report.ok:
                    failures.append(f"{family} on {ranks} ranks {options}:\n{report}")
    assert checked > 100, checked
    assert not failures, "\n".join(failures[:5])


@pytest.mark.parametrize(
    "ranks,hosts",
    [(6, 3), (9, 3), (12, 4), (8, [0, 0, 1, 1, 2, 2, 3, 3]), (8, 8), (16, 8), (24, 8), (32, 16)],
)
def test_hier_on_other_host_layouts(ranks, hosts):
    for count in (0, 1, 13, 257):
        for in_place in (False, True):
            algo = topo.builtin(
                "allreduce",
                "hier",
                ranks,
                count=count,
                hosts=hosts,
                in_place=in_place,
                slot_bytes=8,
                slots=2,
            )
            report = topo.check(algo)
            assert report.ok, report


def test_hier_crosses_a_power_of_two_of_hosts_by_halving_and_doubling():
    """Across 8 hosts a rank's shard goes to partners 4, 2 and 1 hosts away and back (six
    messages), not around a ring of the hosts (fourteen)."""
    algo = topo.builtin("allreduce", "hier", 16, count=1024, hosts=8)
    for rank in range(16):
        across = [
            step
            for channel in algo.programs[rank].channels
            for step in channel.steps
            if {step.send, step.recv} - {None, rank ^ 1}
        ]
        host = rank // 2
        partners = [(step.send // 2) ^ host for step in across]
        assert partners == [4, 2, 1, 1, 2, 4], (rank, partners)


@pytest.mark.parametrize("channels", [1, 2])
def test_the_double_tree_passes_the_checker_on_1_to_33_ranks(channels):
    """From 16 KiB the tree allreduce splits the buffer between two trees, in rounds, on two
    channels of one connection set, each pairing one tree's reduction with the other tree's
    broadcast, listed some rounds behind. Elements of 4 KiB keep the chunks the checker follows
    few: 21 of them, 2 a tree a round: six rounds, more than the trees have levels (5 at most
    here), so that the reductions run ahead of the broadcasts."""
    failures = []
    for ranks in WORLDS:
        for in_place in (False, True):
            algo = topo.builtin(
                "allreduce",
                "tree",
                ranks,
                count=21,
                elem_size=4096,
                in_place=in_place,
                channels=channels,
                slot_bytes=4096,
                slots=4,
            )
            used = {len(p.channels) for p in algo.programs}
            assert used == {2 if ranks > 1 else 1}, (ranks, used)
            report = topo.check(algo)
            if not report.ok:
                failures.append(f"{ranks} ranks, in place {in_place}:\n{report}")
    assert not failures, "\n".join(failures[:3])


def test_every_rank_of_the_double_tree_sends_and_receives_at_most_twice_the_buffer():
    """Every rank is an inner node of at most one of the two trees, so none carries more than
    2 S each way of a buffer of S (the ring's is 2 (p - 1) / p S), as the cost model prices it."""
    count = 64
    for ranks in range(2, 65):
        algo = topo.builtin("allreduce", "tree", ranks, count=count, elem_size=4096)
        sent, received = [0] * ranks, [0] * ranks
        for r, program in enumerate(algo.programs):
            for step in (s for channel in program.channels for s in channel.steps):
                sent[r] += step.count if step.send is not None else 0
                received[r] += step.count if step.recv is not None else 0
        assert max(sent) <= 2 * count and max(received) <= 2 * count, (ranks, sent, received)


@pytest.mark.parametrize("ranks", [3, 5, 8, 9])
def test_plans_of_ranks_that_share_cpus(ranks):
    """rd folds the ranks of each CPU onto its first rank; every family stays right."""
    cpus = [r % 2 for r in range(ranks)]
    for family in topo.algorithms_for("allreduce", topo.Topology(size=ranks)):
        for count in (1, 13):
            report = topo.check(
                topo.builtin("allreduce", family, ranks, count=count, shared_cpu=cpus)
            )
            assert report.ok, (family, report)


def test_a_family_the_world_lacks_is_refused():
    with pytest.raises(ValueError, match="no hier form on 4 ranks over 1 host"):
        topo.builtin("allreduce", "hier", 4)
    with pytest.raises(ValueError, match="no rhd form on 3 ranks"):
        topo.builtin("reduce_scatter", "rhd", 3)
    with pytest.raises(ValueError, match="allgather has no family 'chain'"):
        topo.builtin("allgather", "chain", 4)


# ---- seeded bugs --------------------------------------------------------------------------


def ring(ranks: int = 4, count: int = 8, **options) -> topo.Algorithm:
    return topo.builtin("allreduce", "ring", ranks, count=count, **options)


def pairwise_sum(rank: int) -> list[Step]:
    """A hand-written allreduce of 2 ranks: swap inputs, then add the peer's to one's own."""
    peer = 1 - rank
    return [
        Step(send=peer, local=Span("input", 0, 4), count=4),
        Step(recv=peer, dst=Span("scratch", 0, 4), count=4),
        Step(kind="local_reduce", local=Span("scratch", 0, 8), dst=Span("output", 0, 4), count=4),
    ]


def hand_written(steps_of) -> topo.Algorithm:
    programs = [topo.RankProgram([topo.Channel(steps_of(r))], scratch=8) for r in (0, 1)]
    return topo.Algorithm("pairwise", "allreduce", 2, 4, programs)


def whole_pairwise_sum(rank: int) -> list[Step]:
    steps = pairwise_sum(rank)
    steps.insert(2, Step(local=Span("input", 0, 4), dst=Span("scratch", 4, 4), count=4))
    return steps


def test_a_hand_written_algorithm_is_checked_like_a_builtin():
    assert topo.check(hand_written(whole_pairwise_sum)).ok
    report = topo.check(hand_written(pairwise_sum))  # scratch[4:8] is never written
    assert not report.ok
    assert "channel 0 step 2 (local_reduce): reads scratch[4] before any step wrote it" in str(
        report.errors[0]
    )


def test_a_dropped_send_is_reported():
    algo = ring()
    step = algo.programs[2].channels[0].steps[0]
    step.send, step.dst = None, Span("output", 6, 2)  # keeps its block instead of sending it
    (error,) = topo.check(algo).errors
    assert (error.rank, error.step, error.step_name) == (3, 6, "recv")
    assert "waits to receive from rank 2 (rank 2 has finished its steps)" in error.text


def test_a_doubled_reduction_is_reported():
    def steps(rank):
        s = whole_pairwise_sum(rank)
        if rank == 1:  # adds its own input to the sum a second time
            s += [
                Step(local=Span("output", 0, 4), dst=Span("scratch", 0, 4), count=4),
                Step(
                    kind="local_reduce",
                    local=Span("scratch", 0, 8),
                    dst=Span("output", 0, 4),
                    count=4,
                ),
            ]
        return s

    (error,) = topo.check(hand_written(steps)).errors
    assert (error.rank, error.step, error.step_name) == (1, 5, "local_reduce")
    assert "holding rank 1's input[0]" in error.text and "twice" in error.text


def test_a_swapped_chunk_is_reported():
    algo = ring()
    steps = algo.programs[3].channels[0].steps
    steps[5].dst, steps[6].dst = steps[6].dst, steps[5].dst
    errors = topo.check(algo).errors
    assert [e.rank for e in errors] == [3, 3, 3, 3]
    assert errors[0].text.startswith("output[0] misses rank 0's input[0]")
    assert "holds rank 0's input[2]" in errors[0].text


def test_ranks_that_wait_on_each_other_are_a_deadlock():
    algo = topo.builtin("allreduce", "rd", 2, count=4)
    for rank in (0, 1):  # each receives before it sends: neither sends
        exchange = algo.programs[rank].channels[0].steps[0]
        algo.programs[rank].channels[0].steps[0:1] = [
            Step(recv=1 - rank, local=exchange.operand, dst=exchange.dst, count=4),
            Step(send=1 - rank, local=exchange.local, count=4),
        ]
    (error,) = topo.check(algo).errors
    assert error.text == (
        "deadlock: rank 0 channel 0 step 0 waits to receive from rank 1; "
        "rank 1 channel 0 step 0 waits to receive from rank 0"
    )


def test_too_little_buffering_deadlocks_a_ring():
    """Planned for 8 slots per connection, the ring's steps fill one slot and wait for room."""
    algo = ring(count=16, slot_bytes=8, slots=8)
    assert topo.check(algo).ok
    (error,) = topo.check(algo, slots=1).errors
    assert error.text.startswith(
        "deadlock: rank 0 channel 0 step 0 waits for room to send to "
        "rank 1 (its 1 slot(s) are full); rank 1"
    )


def two_rank_swap(as_exchange: bool) -> topo.Algorithm:
    """A 2-rank allreduce of 4 elements: each rank sends its input and reduces the peer's into
    its output, as one exchange step or as a send followed by a receive."""
    p = topo.Program("allreduce", ranks=2, count=4, name="swap")
    for r in (0, 1):
        if as_exchange:
            p.exchange(r, 1 - r, send=p.input[0:4], recv=p.output[0:4], operand=p.input[0:4])
        else:
            p.send(r, to=1 - r, src=p.input[0:4])
            p.recv_reduce(r, frm=1 - r, src=p.input[0:4], dst=p.output[0:4])
    return p.algorithm()


def test_rendezvous_sends_wait_for_their_receivers():
    """slots=0: a send waits until its receiver takes it (NCCL's p2p). Two ranks that both send
    before they receive pass with buffered sends and deadlock with rendezvous ones; as one
    exchange, they pass both ways. A ring, whose first step only sends, deadlocks too."""
    sends_first = two_rank_swap(as_exchange=False)
    assert topo.check(sends_first).ok
    (error,) = topo.check(sends_first, slots=0).errors
    assert error.text == (
        "deadlock: rank 0 channel 0 step 0 waits for rank 1 to receive its send (rendezvous); "
        "rank 1 channel 0 step 0 waits for rank 0 to receive its send (rendezvous)"
    )
    exchange = two_rank_swap(as_exchange=True)
    assert topo.check(exchange).ok and topo.check(exchange, slots=0).ok
    (error,) = topo.check(ring(count=16, slot_bytes=8, slots=8), slots=0).errors
    assert error.text.startswith("deadlock: ") and "(rendezvous)" in error.text
    # recursive doubling is all exchanges, message by message: fine without buffering.
    assert topo.check(topo.builtin("allreduce", "rd", 4, count=16), slots=0).ok
    with pytest.raises(ValueError, match="0: rendezvous"):
        topo.check(exchange, slots=-1)


def test_a_wait_cycle_across_ranks_and_channels_is_named_channel_by_channel():
    """Each rank receives on one channel and sends on the other only once that receive is done,
    and the two ranks pick opposite channels to receive on: no rank waits on itself, yet the
    four channels wait on each other in a circle."""
    p = topo.Program("allreduce", ranks=2, count=2, name="crossed")
    for r, (receives, sends) in ((0, (0, 1)), (1, (1, 0))):
        got = p.recv(r, frm=1 - r, dst=p.output[0:2], channel=receives)
        p.send(r, to=1 - r, src=p.input[0:2], channel=sends, after=got)
    (error,) = topo.check(p.algorithm()).errors
    assert error.text == (
        "deadlock: rank 0 channel 0 step 0 waits to receive from rank 1; "
        "rank 1 channel 0 step 0 waits for its channel 1 to finish step 0; "
        "rank 1 channel 1 step 0 waits to receive from rank 0; "
        "rank 0 channel 1 step 0 waits for its channel 0 to finish step 0"
    )


def test_overwriting_what_a_send_by_reference_still_points_at_is_reported():
    algo = topo.builtin("allreduce", "rd", 4, count=64, slot_bytes=16, slots=2)
    for program in algo.programs:
        program.channels[0].steps[2].wait_sends = False
    (error,) = topo.check(algo).errors
    assert error.step_name == "copy" and "reads by reference" in error.text
    assert "needs wait_sends" in error.text


def test_spans_outside_their_buffers_and_wrong_lengths_are_reported():
    algo = ring()
    algo.programs[1].channels[0].steps[0].local = Span("input", 7, 2)
    algo.programs[2].channels[0].steps[1].count = 3
    errors = [str(e) for e in topo.check(algo).errors]
    assert "rank 1 channel 0 step 0 (send): local input[7:9] lies outside input (8 elements)" in (
        errors
    )
    assert any(e.startswith("rank 2 channel 0 step 1 (recv_reduce_send): local") for e in errors)


# ---- JSON ---------------------------------------------------------------------------------


def test_an_algorithm_survives_json(tmp_path):
    algo = topo.builtin("allreduce", "hier", 8, count=13, hosts=2, avg=True, in_place=True)
    path = tmp_path / "hier.json"
    algo.save(path)
    again = topo.load(path)
    assert again == algo
    assert topo.check(again).ok


@pytest.mark.parametrize(
    "edit,message",
    [
        (lambda d: d.pop("collective"), "top level: missing 'collective'"),
        (lambda d: d.update(collective="allsum"), "collective 'allsum': use one of"),
        (lambda d: d["programs"].pop(), "programs: 3 programs for 4 ranks"),
        (
            lambda d: d["programs"][1]["channels"][0]["steps"][2].update(kind="jump"),
            "rank 1 channel 0 step 2: kind 'jump'",
        ),
        (
            lambda d: d["programs"][2]["channels"][0]["steps"][0].update(send=9),
            "rank 2 channel 0 step 0: send peer 9 is not a rank of 4",
        ),
        (
            lambda d: d["programs"][0]["channels"][0]["steps"][0].update(local=["heap", 0, 1]),
            "local must be [buffer, offset, count]",
        ),
        (
            lambda d: d["programs"][0]["channels"][0]["steps"][1].update(count="2"),
            "'count' must be an integer",
        ),
        (lambda d: d.update(format="msccl"), "format 'msccl' is not 'weft-algorithm/1'"),
    ],
)
def test_a_malformed_file_is_refused_with_where_and_what(tmp_path, edit, message):
    data = ring().to_json()
    edit(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(topo.AlgorithmError, match=message.replace("[", r"\[").replace("(", r"\(")):
        topo.load(path)


# ---- python -m weft.topo ----------------------------------------------------------------------


def test_the_command_line_exports_and_checks_files(tmp_path, capsys):
    from weft.topo.__main__ import main

    good, bad = tmp_path / "tree.json", tmp_path / "bad.json"
    assert main(["export", "allreduce", "tree", "6", "--count", "100", "-o", str(good)]) == 0
    assert main(["check", str(good)]) == 0
    assert "tree on 6 ranks: ok" in capsys.readouterr().out
    data = json.loads(good.read_text())
    data["programs"][3]["channels"][0]["steps"].pop(0)  # rank 3 forgets its first step
    bad.write_text(json.dumps(data))
    assert main(["check", str(good), str(bad)]) == 1
    out = capsys.readouterr().out
    assert f"{good}: tree on 6 ranks: ok" in out and f"{bad}: tree on 6 ranks:" in out
    assert "rank 3" in out.split(str(bad))[1]


# ---- the DSL ----------------------------------------------------------------------------------


def swap_program(copy_after_the_reduction: bool) -> topo.Algorithm:
    """Two channels per rank: channel 1 swaps and adds, channel 0 copies the sum out once a
    step of channel 1 is done (the reduction, or by mistake the send)."""
    p = topo.Program("allreduce", ranks=2, count=4, name="swap")
    for r in (0, 1):
        sent = p.send(r, to=1 - r, src=p.input[0:4], channel=1)
        reduced = p.recv_reduce(r, frm=1 - r, src=p.input[0:4], dst=p.scratch[2:6], channel=1)
        after = reduced if copy_after_the_reduction else sent
        p.copy(r, p.scratch[2:6], p.output[0:4], after=after, channel=0)
    return p.algorithm()


def test_a_program_writes_an_algorithm_step_by_step():
    algo = swap_program(copy_after_the_reduction=True)
    assert [len(prog.channels) for prog in algo.programs] == [2, 2]
    assert algo.programs[0].scratch == 6
    assert algo.programs[1].channels[0].steps[0].deps == [(1, 1)]
    assert topo.check(algo).ok
    report = topo.check(swap_program(copy_after_the_reduction=False))
    assert not report.ok and "reads scratch[2] before any step wrote it" in str(report)


def staged_sum(ordered: bool) -> topo.Algorithm:
    """Channel 0 stages the rank's input while channel 1 swaps with the peer and adds both:
    right only where the addition waits for the staging."""
    p = topo.Program("allreduce", ranks=2, count=4, name="staged")
    for r in (0, 1):
        staged = p.copy(r, p.input[0:4], p.scratch[4:8])
        p.send(r, to=1 - r, src=p.input[0:4], channel=1)
        p.recv(r, frm=1 - r, dst=p.scratch[0:4], channel=1)
        after = staged if ordered else ()
        p.local_reduce(r, p.scratch[0:8], p.output[0:4], after=after, channel=1)
    return p.algorithm()


def test_channels_of_a_rank_that_touch_one_element_unordered_are_a_race():
    assert topo.check(staged_sum(ordered=True)).ok
    (error,) = topo.check(staged_sum(ordered=False)).errors  # the order run here got it right
    assert (error.channel, error.step_name) == (1, "local_reduce")
    assert "reads scratch[4], which channel 0 also touches with nothing ordering" in error.text


def test_a_program_refuses_what_makes_no_sense():
    p = topo.Program("allreduce", ranks=2, count=4, name="bad")
    other = p.send(1, to=0, src=p.input[0:4])
    with pytest.raises(topo.AlgorithmError, match="rank 0 cannot wait for a step of rank 1"):
        p.recv(0, frm=1, dst=p.output[0:4], after=other)
    with pytest.raises(topo.AlgorithmError, match="unknown option"):
        p.copy(0, p.input[0:4], p.output[0:4], wait=True)
    with pytest.raises(topo.AlgorithmError, match="rank 2 channel 0: not in a world of 2"):
        p.copy(2, p.input[0:4], p.output[0:4])
    with pytest.raises(topo.AlgorithmError, match="consecutive elements"):
        p.input[0:4:2]


# ---- the executor's corners -------------------------------------------------------------------


def one_step(step: Step, scratch: int = 8) -> topo.Algorithm:
    """A 2-rank allreduce whose rank 0 has one extra step in front (rank 1 mirrors nothing)."""
    algo = hand_written(whole_pairwise_sum)
    algo.programs[0].channels[0].steps.insert(0, step)
    algo.programs[0].scratch = scratch
    return algo


@pytest.mark.parametrize(
    "step,message",
    [
        (
            Step(
                kind="exchange",
                send=1,
                recv=1,
                local=Span("input", 0, 4),
                dst=Span("scratch", 0, 4),
                finalize=True,
            ),
            "divides (finalize) only with an operand",
        ),
        (
            Step(
                kind="exchange",
                local=Span("input", 0, 4),
                dst=Span("scratch", 0, 4),
                operand=Span("input", 0, 4),
                send=1,
            ),
            "its dst one to receive from",
        ),
        (
            Step(
                kind="local_reduce", local=Span("input", 0, 4), dst=Span("scratch", 0, 4), count=4
            ),
            "two or more blocks",
        ),
        (
            Step(
                kind="local_reduce", local=Span("scratch", 0, 8), dst=Span("scratch", 4, 2), count=2
            ),
            "overlaps a block it has yet to read",
        ),
        (
            Step(local=Span("output", 0, 4), dst=Span("input", 0, 4), count=4),
            "writes into the input",
        ),
        (Step(send=5, local=Span("input", 0, 4), count=4), "send peer 5 is not another rank"),
        (Step(kind="jump", count=1), "kind 'jump'"),
    ],
)
def test_steps_the_executor_would_run_otherwise_are_refused(step, message):
    report = topo.check(one_step(step, scratch=12))
    assert not report.ok and message in str(report.errors[0]), report


def test_a_larger_buffer_is_checked_as_the_executor_cuts_it():
    """Both ranks send 4 elements, then receive: fine while a step fits the slots, a deadlock
    once each element stands for more than the slots hold."""
    algo = hand_written(whole_pairwise_sum)
    assert topo.check(algo, slots=2, slot_bytes=16).ok
    assert topo.check(algo, slots=2, slot_bytes=16, scale=2).ok  # 4 messages of 2 x 2 x 4 bytes
    (error,) = topo.check(algo, slots=2, slot_bytes=16, scale=3).errors  # 3 messages each
    assert error.text.startswith("deadlock: rank 0 channel 0 step 0 waits for room to send")


def test_an_algorithm_too_long_to_label_is_refused_at_once():
    """The checker labels every element; past its bound it says how to write the algorithm
    instead of filling the memory (a 4-rank allreduce of 2^18 elements: 2^21 labels, the bound,
    which takes about 10 s; one more element is over it)."""
    at_bound = topo.builtin("allreduce", "ring", 4, count=1 << 18)
    over = topo.builtin("allreduce", "ring", 4, count=(1 << 18) + 1)
    started = time.monotonic()
    (error,) = topo.check(over).errors
    assert time.monotonic() - started < 1
    assert "labels every element" in error.text and "a chunk per element" in error.text
    assert f"{2 * 4 * over.count} here, and takes at most {MODELLED_ELEMENTS}" in error.text
    assert MODELLED_ELEMENTS == 2 * 4 * at_bound.count


def test_a_file_with_keys_the_checker_does_not_know_is_refused(tmp_path):
    data = ring().to_json()
    data["programs"][0]["channels"][0]["steps"][0]["wait_send"] = True  # a typo
    path = tmp_path / "typo.json"
    path.write_text(json.dumps(data))
    with pytest.raises(topo.AlgorithmError, match="step 0: unknown key.s. wait_send"):
        topo.load(path)
