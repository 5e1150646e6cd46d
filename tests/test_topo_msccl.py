"""topo.load_msccl: MSCCL algorithm XML as an Algorithm, checked like any other. The published
files in ../shared/msccl (see its SOURCES.md) import and pass the checker; a ring written here in
the same format does too, and broken copies of it are refused naming the element, or fail the
checker naming the rank and step. Files written here take every step kind, scratch buffers and
dependencies between thread blocks; they pass the checker and run on real ranks against numpy."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from weft import topo

SHARED = Path(__file__).resolve().parents[2] / "shared" / "msccl"
PUBLISHED = sorted(SHARED.glob("*.xml")) if SHARED.is_dir() else []


def step(s, kind, src=("i", 0), dst=("i", 0), dep=(-1, -1), hasdep=0, cnt=1) -> dict:
    return dict(
        s=s,
        type=kind,
        srcbuf=src[0],
        srcoff=src[1],
        dstbuf=dst[0],
        dstoff=dst[1],
        cnt=cnt,
        depid=dep[0],
        deps=dep[1],
        hasdep=hasdep,
    )


def algo_xml(header: str, gpus: list[tuple[str, list[tuple[str, list[dict]]]]]) -> str:
    """``<algo header>`` of ``gpus``: per gpu its attributes and thread blocks, each its
    attributes and steps."""
    body = ""
    for gpu, blocks in gpus:
        body += f"<gpu {gpu}>"
        for tb, steps in blocks:
            items = ("<step " + " ".join(f'{k}="{v}"' for k, v in x.items()) + "/>" for x in steps)
            body += f"<tb {tb}>{''.join(items)}</tb>"
        body += "</gpu>"
    return f"<algo {header}>{body}</algo>"


def ring_xml(ranks: int = 3, edit=lambda rank, steps: steps) -> str:
    """An in-place ring allreduce of `ranks` chunks, one thread block per rank, in MSCCL's old
    format (no minBytes/maxBytes/outofplace)."""
    gpus = []
    for r in range(ranks):
        own = [(r - k) % ranks for k in range(ranks)]
        types = ["s"] + ["rrs"] * (ranks - 2) + ["rrcs"] + ["rcs"] * (ranks - 2) + ["r"]
        chunks = own + own[:-1]
        steps = [step(i, t, ("i", c), ("i", c)) for i, (t, c) in enumerate(zip(types, chunks))]
        tb = f'id="0" send="{(r + 1) % ranks}" recv="{(r - 1) % ranks}" chan="0"'
        gpus.append(
            (f'id="{r}" i_chunks="{ranks}" o_chunks="0" s_chunks="0"', [(tb, edit(r, steps))])
        )
    header = (
        f'name="ring{ranks}" proto="Simple" nchannels="1" nchunksperloop="{ranks}" '
        f'ngpus="{ranks}" coll="allreduce" inplace="1"'
    )
    return algo_xml(header, gpus)


def allpairs_xml(ranks: int, edit=lambda rank, blocks: blocks) -> str:
    """An out-of-place allreduce in the new format that takes every step kind but the fused
    ring ones: rank r owns chunk r. A thread block per peer sends that peer its chunk of r's
    input and receives the peer's copy of chunk r into scratch; a local block copies r's own
    chunk to the output (cpy), reduces each peer's scratch slot into it (re, each waiting on
    that peer's receive), and ends in a nop the peer blocks wait on before they send the sum
    and receive the peer's sum into the output."""
    gpus = []
    for r in range(ranks):
        peers = [p for p in range(ranks) if p != r]
        local = len(peers)  # the local block comes after the peer blocks
        blocks = []
        for b, p in enumerate(peers):
            steps = [
                step(0, "s", ("i", p), ("s", 0)),  # lands in the peer's scratch
                step(1, "r", ("s", b), ("s", b), hasdep=1),
                step(2, "s", ("o", r), ("o", r), dep=(local, len(peers) + 1)),
                step(3, "r", ("o", p), ("o", p)),
            ]
            blocks.append((f'id="{b}" send="{p}" recv="{p}" chan="0"', steps))
        steps = [step(0, "cpy", ("i", r), ("o", r))]
        steps += [step(1 + b, "re", ("s", b), ("o", r), dep=(b, 1)) for b in range(len(peers))]
        steps.append(step(len(peers) + 1, "nop", cnt=0, hasdep=1))
        blocks.append((f'id="{local}" send="-1" recv="-1" chan="0"', steps))
        attrs = f'id="{r}" i_chunks="{ranks}" o_chunks="{ranks}" s_chunks="{len(peers)}"'
        gpus.append((attrs, edit(r, blocks)))
    header = (
        f'name="allpairs{ranks}" proto="Simple" nchannels="1" nchunksperloop="{ranks}" '
        f'ngpus="{ranks}" coll="allreduce" inplace="0" outofplace="1" minBytes="0" '
        'maxBytes="0"'
    )
    return algo_xml(header, gpus)


def pair_rrc_xml() -> str:
    """Two ranks: each sends the other's chunk of its input, receives its own chunk's other
    half and reduces it with its input into the output in one step (rrc), then swaps sums."""
    gpus = []
    for r in range(2):
        p = 1 - r
        steps = [
            step(0, "s", ("i", p), ("i", p)),
            step(1, "rrc", ("i", r), ("o", r)),
            step(2, "s", ("o", r), ("o", r)),
            step(3, "r", ("o", p), ("o", p)),
        ]
        tb = f'id="0" send="{p}" recv="{p}" chan="0"'
        gpus.append((f'id="{r}" i_chunks="2" o_chunks="2" s_chunks="0"', [(tb, steps)]))
    header = 'name="pair" nchunksperloop="2" ngpus="2" coll="allreduce" inplace="0"'
    return algo_xml(header, gpus)


def load(tmp_path, text: str) -> topo.Algorithm:
    path = tmp_path / "algo.xml"
    path.write_text(text)
    return topo.load_msccl(path)


@pytest.mark.skipif(not PUBLISHED, reason=f"no published MSCCL files in {SHARED}")
@pytest.mark.parametrize("path", PUBLISHED, ids=lambda p: p.name)
def test_published_algorithms_import_and_pass_the_checker(path):
    algo = topo.load_msccl(path)
    assert algo.ranks in (4, 8) and all(len(p.channels) > 1 for p in algo.programs)
    report = topo.check(algo)
    assert report.ok, report


@pytest.mark.parametrize("ranks", [2, 3, 5, 8])
def test_a_ring_in_msccls_format_imports_and_passes(tmp_path, ranks):
    algo = load(tmp_path, ring_xml(ranks))
    assert (algo.collective, algo.ranks, algo.count, algo.in_place) == (
        "allreduce",
        ranks,
        ranks,
        True,
    )
    names = [s.name for s in algo.programs[0].channels[0].steps]
    assert names[0] == "send" and names[-1] == "recv" and len(names) == 2 * ranks - 1
    report = topo.check(algo)
    assert report.ok, report


def test_a_wrong_step_type_fails_the_checker_at_its_rank_and_step(tmp_path):
    def forget_to_reduce(rank, steps):
        if rank == 1:
            steps[2]["type"] = "rcs"  # drops its own contribution
        return steps

    report = topo.check(load(tmp_path, ring_xml(3, forget_to_reduce)))
    assert not report.ok
    assert all("misses rank 1's input" in e.text for e in report.errors), report


@pytest.mark.parametrize(
    "edit,message",
    [
        (
            lambda r, s: [{k: v for k, v in x.items() if k != "cnt"} for x in s],
            "<gpu id=0> <tb id=0> <step s=0>: missing attribute 'cnt'",
        ),
        (
            lambda r, s: [dict(x, type="rrrs") if x["s"] == 1 else x for x in s],
            "<step s=1>: type='rrrs': the importer takes s, r, rcs",
        ),
        (
            lambda r, s: [dict(x, depid=2, deps=0) if x["s"] == 3 else x for x in s],
            "<step s=3>: depid=2 deps=0: a dependency names another thread block",
        ),
        (
            lambda r, s: [dict(x, srcbuf="x") if x["s"] == 0 else x for x in s],
            "srcbuf='x': use i, o or s",
        ),
        (lambda r, s: s[::-1], "steps must be numbered 0, 1, ... in order"),
    ],
)
def test_a_broken_file_is_refused_naming_the_element(tmp_path, edit, message):
    with pytest.raises(topo.AlgorithmError, match=message.replace("(", r"\(")):
        load(tmp_path, ring_xml(3, edit))


def test_files_that_are_not_algorithms_are_refused(tmp_path):
    with pytest.raises(topo.AlgorithmError, match="not XML"):
        load(tmp_path, "<algo")
    with pytest.raises(topo.AlgorithmError, match="coll='broadcast'"):
        load(tmp_path, ring_xml(3).replace('coll="allreduce"', 'coll="broadcast"'))
    with pytest.raises(topo.AlgorithmError, match=r"gpu ids \[0, 1, 2\] are not 0..3"):
        load(tmp_path, ring_xml(3).replace('ngpus="3"', 'ngpus="4"'))
    huge = "1" * 40  # found by tests/fuzz: once an OverflowError, not a refusal
    with pytest.raises(topo.AlgorithmError, match=rf"gpu ids \[0, 1, 2\] are not 0..{huge[:-1]}0"):
        load(tmp_path, ring_xml(3).replace('ngpus="3"', f'ngpus="{huge}"'))
    with pytest.raises(topo.AlgorithmError, match="recv=5 is not another rank of 3"):
        load(tmp_path, ring_xml(3).replace('recv="2"', 'recv="5"', 1))


def test_the_command_line_takes_msccl_files(tmp_path, capsys):
    """python -m weft.topo check, simulate and draw read MSCCL XML by its suffix; a broken
    file is refused naming the element, and check exits with 1."""
    from weft.topo.__main__ import main

    good, bad = tmp_path / "ring5.xml", tmp_path / "bad.xml"
    good.write_text(ring_xml(5))
    bad.write_text(ring_xml(5).replace('type="rrcs"', 'type="xx"', 1))
    assert main(["check", str(good)]) == 0
    assert f"{good}: ring5 on 5 ranks: ok" in capsys.readouterr().out
    assert main(["check", str(good), str(bad)]) == 1
    assert f"{bad}: <gpu id=0> <tb id=0> <step s=4>: type='xx'" in capsys.readouterr().out
    assert main(["simulate", str(good), "--topology", "ring:5", "--bytes", "5K"]) == 0
    assert "on 5 ranks" in capsys.readouterr().out
    pytest.importorskip("matplotlib")
    png = tmp_path / "ring5.png"
    args = [
        "draw",
        "timeline",
        str(good),
        "--topology",
        "switch:5",
        "--bytes",
        "5K",
        "-o",
        str(png),
    ]
    assert main(args) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("ranks", [2, 3, 5])
def test_scratch_local_steps_and_dependencies_import_and_pass(tmp_path, ranks):
    algo = load(tmp_path, allpairs_xml(ranks))
    assert (algo.collective, algo.count, algo.in_place) == ("allreduce", ranks, False)
    program = algo.programs[0]
    assert program.scratch == ranks - 1 and len(program.channels) == ranks
    local = program.channels[-1].steps
    assert [s.name for s in local] == ["copy"] + ["reduce"] * (ranks - 1) + ["nop"]
    assert [s.deps for s in local[1:-1]] == [[(b, 1)] for b in range(ranks - 1)]
    assert program.channels[0].steps[2].deps == [(ranks - 1, ranks)]
    report = topo.check(algo)
    assert report.ok, report
    assert topo.check(load(tmp_path, pair_rrc_xml())).ok


def case_run_files(ctx, paths, factor):
    """Each file's algorithm on these ranks, each element standing for ``factor``."""
    wrong = []
    for path in paths:
        algo = topo.load_msccl(path)
        n, r = ctx.size, ctx.rank
        rng = np.random.default_rng(7)
        inputs = [rng.integers(-50, 50, algo.count * factor).astype(np.float32) for _ in range(n)]
        out = np.full(algo.count * factor, np.nan, dtype=np.float32)
        topo.run(algo, ctx.comm, inputs[r], out)
        if not np.array_equal(out, sum(inputs)):
            wrong.append(f"rank {r}: {Path(path).name} x{factor}: {out} != {sum(inputs)}")
    return wrong


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_they_run_on_real_ranks(tmp_path, pools, transport):
    paths = []
    for name, text in [("allpairs3.xml", allpairs_xml(3))]:
        paths.append(tmp_path / name)
        paths[-1].write_text(text)
    for factor in (1, 7):
        assert pools.get(3, transport).run(case_run_files, paths, factor) == [[], [], []]
    pair = tmp_path / "pair.xml"
    pair.write_text(pair_rrc_xml())
    assert pools.get(2, transport).run(case_run_files, [pair], 5) == [[], []]


def test_seeded_bugs_in_them_are_named(tmp_path):
    def same_scratch_slot(rank, blocks):
        if rank == 0:
            blocks[1][1][1]["dstoff"] = 0  # peer 2's chunk lands where peer 1's does
        return blocks

    report = topo.check(load(tmp_path, allpairs_xml(3, same_scratch_slot)))
    assert not report.ok
    assert any(
        e.rank == 0 and "writes scratch[0], which channel 0 also touches" in e.text
        for e in report.errors
    ), report

    def wait_for_the_sum(rank, blocks):
        if rank == 1:  # the first reduce waits for a receive that waits for every reduce
            blocks[-1][1][1]["deps"] = 3
            blocks[0][1][3]["hasdep"] = 1
        return blocks

    report = topo.check(load(tmp_path, allpairs_xml(3, wait_for_the_sum)))
    assert [e.text for e in report.errors] == [
        "deadlock: rank 1 channel 0 step 2 waits for its channel 2 to finish step 3; "
        "rank 1 channel 2 step 1 waits for its channel 0 to finish step 3"
    ]

    report = topo.check(load(tmp_path, allpairs_xml(3).replace('s_chunks="2"', 's_chunks="1"', 1)))
    assert "dst scratch[1:2] lies outside scratch (1 elements)" in [e.text for e in report.errors]


def test_a_dependency_msccls_runtime_never_signals_is_refused(tmp_path):
    def unmarked(rank, blocks):
        if rank == 2:
            blocks[1][1][1]["hasdep"] = 0
        return blocks

    with pytest.raises(
        topo.AlgorithmError,
        match=r"<gpu id=2> <tb id=2> <step s=2>: depends on step 1 of thread block 1, but "
        "neither it nor a later step of that block has hasdep=1",
    ):
        load(tmp_path, allpairs_xml(3, unmarked))
    with pytest.raises(topo.AlgorithmError, match="<step s=1>: hasdep='yes': use 0 or 1"):
        load(tmp_path, allpairs_xml(3).replace('hasdep="1"', 'hasdep="yes"', 1))
    with pytest.raises(topo.AlgorithmError, match="depends on step 9 of thread block 0, which has"):
        load(tmp_path, allpairs_xml(3).replace('deps="1"', 'deps="9"', 1))
