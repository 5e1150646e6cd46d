"""topo.load_msccl: MSCCL algorithm XML as an Algorithm, checked like any other. The published
files in ../shared/msccl (see its SOURCES.md) import and pass the checker; a ring written here in
the same format does too, and broken copies of it are refused naming the element, or fail the
checker naming the rank and step."""

from __future__ import annotations

from pathlib import Path

import pytest
from weft import topo

SHARED = Path(__file__).resolve().parents[2] / "shared" / "msccl"
PUBLISHED = sorted(SHARED.glob("*.xml")) if SHARED.is_dir() else []


def ring_xml(ranks: int = 3, edit=lambda rank, steps: steps) -> str:
    """An in-place ring allreduce of `ranks` chunks, one thread block per rank, in MSCCL's old
    format (no minBytes/maxBytes/outofplace)."""
    gpus = []
    for r in range(ranks):
        own = [(r - k) % ranks for k in range(ranks)]
        types = ["s"] + ["rrs"] * (ranks - 2) + ["rrcs"] + ["rcs"] * (ranks - 2) + ["r"]
        chunks = own + own[:-1]
        steps = [
            dict(
                s=i,
                type=t,
                srcbuf="i",
                srcoff=c,
                dstbuf="i",
                dstoff=c,
                cnt=1,
                depid=-1,
                deps=-1,
                hasdep=0,
            )
            for i, (t, c) in enumerate(zip(types, chunks))
        ]
        body = "".join(
            "<step " + " ".join(f'{k}="{v}"' for k, v in step.items()) + "/>"
            for step in edit(r, steps)
        )
        gpus.append(
            f'<gpu id="{r}" i_chunks="{ranks}" o_chunks="0" s_chunks="0">'
            f'<tb id="0" send="{(r + 1) % ranks}" recv="{(r - 1) % ranks}" chan="0">{body}</tb>'
            "</gpu>"
        )
    return (
        f'<algo name="ring{ranks}" proto="Simple" nchannels="1" nchunksperloop="{ranks}" '
        f'ngpus="{ranks}" coll="allreduce" inplace="1">{"".join(gpus)}</algo>'
    )


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
