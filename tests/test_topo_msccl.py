"""topo.load_msccl: MSCCL algorithm XML as an Algorithm, checked like any other. The published
files in ../shared/msccl (see its SOURCES.md) import and pass the checker; a ring written here in
the same format does too, and broken copies of it are refused naming the element, or fail the
checker naming the rank and step. Files written here take every step kind, scratch buffers and
dependencies between thread blocks; they pass the checker and run on real ranks against numpy.
So do a broadcast and a reduce, whose root the importer reads off the program, and an allgather
in the format SCCL's and TACCL's ncclize write, whose own blocks reach the output by <copy>."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from weft import topo
from weft.topo import Span

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
    chunk to the output (cpy) and reduces every peer's scratch slot into it (re), waiting first
    for every receive as msccl-tools writes a step of several dependencies: a nop for each but
    the last, which the first re carries (the re steps after it fuse into one in MSCCL's
    runtime). The last re marks the sum (hasdep), which the peer blocks wait for before they
    send it and receive the peer's sum into the output."""
    gpus = []
    for r in range(ranks):
        peers = [p for p in range(ranks) if p != r]
        local, last = len(peers), 2 * len(peers) - 1  # the local block, the index of its last re
        blocks = []
        for b, p in enumerate(peers):
            steps = [
                step(0, "s", ("i", p), ("s", 0)),  # lands in the peer's scratch
                step(1, "r", ("s", b), ("s", b), hasdep=1),
                step(2, "s", ("o", r), ("o", r), dep=(local, last)),
                step(3, "r", ("o", p), ("o", p)),
            ]
            blocks.append((f'id="{b}" send="{p}" recv="{p}" chan="0"', steps))
        steps = [step(0, "cpy", ("i", r), ("o", r))]
        steps += [step(1 + b, "nop", cnt=0, dep=(b, 1)) for b in range(len(peers) - 1)]
        for b in range(len(peers)):
            first, marks = b == 0, int(b == len(peers) - 1)
            dep = (len(peers) - 1, 1) if first else (-1, -1)
            steps.append(step(len(peers) + b, "re", ("s", b), ("o", r), dep=dep, hasdep=marks))
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


def tree_broadcast_xml(ranks: int, root: int, in_place: bool = False, chunks: int = 3) -> str:
    """A binary tree broadcast from `root` of `chunks` chunks, chunk by chunk: tree position p
    (rank root + p) passes each chunk to positions 2p + 1 and 2p + 2. A rank with children
    receives a chunk into its output and forwards it to the first child in one step (rcs); a
    second thread block sends it on to the second child once that step is done (depid/deps).
    The root sends from its input, out of place also copying it to its output; in place every
    rank's one buffer is its input."""
    buf = "i" if in_place else "o"
    gpus = []
    for r in range(ranks):
        p = (r - root) % ranks
        children = [(root + c) % ranks for c in (2 * p + 1, 2 * p + 2) if c < ranks]
        parent = (root + (p - 1) // 2) % ranks
        blocks = []
        if p == 0:
            for b, child in enumerate(children):
                steps = [step(k, "s", ("i", k), (buf, k)) for k in range(chunks)]
                blocks.append((f'id="{b}" send="{child}" recv="-1" chan="0"', steps))
            if not in_place:
                steps = [step(0, "cpy", ("i", 0), ("o", 0), cnt=chunks)]
                blocks.append((f'id="{len(blocks)}" send="-1" recv="-1" chan="0"', steps))
        elif not children:
            steps = [step(k, "r", (buf, k), (buf, k)) for k in range(chunks)]
            blocks.append((f'id="0" send="-1" recv="{parent}" chan="0"', steps))
        else:
            steps = [step(k, "rcs", (buf, k), (buf, k), hasdep=1) for k in range(chunks)]
            blocks.append((f'id="0" send="{children[0]}" recv="{parent}" chan="0"', steps))
            if len(children) > 1:
                steps = [step(k, "s", (buf, k), (buf, k), dep=(0, k)) for k in range(chunks)]
                blocks.append((f'id="1" send="{children[1]}" recv="-1" chan="0"', steps))
        sizes = (chunks, 0) if in_place else (chunks if p == 0 else 0, chunks)
        attrs = f'id="{r}" i_chunks="{sizes[0]}" o_chunks="{sizes[1]}" s_chunks="0"'
        gpus.append((attrs, blocks))
    header = (
        f'name="tree_bcast{ranks}" proto="Simple" nchannels="1" nchunksperloop="{chunks}" '
        f'ngpus="{ranks}" coll="broadcast" inplace="{int(in_place)}" '
        f'outofplace="{int(not in_place)}" minBytes="0" maxBytes="0"'
    )
    return algo_xml(header, gpus)


def chain_reduce_xml(ranks: int, root: int, in_place: bool = False, chunks: int = 4) -> str:
    """A chain reduce into `root` of `chunks` chunks, from rank root + 1 round to the root, the
    even chunks on chan 0 and the odd ones on chan 1 (a thread block each): the first rank sends
    its input, the others receive, add their input and send on (rrs). The root adds its input to
    the even chunks into its output as it receives them (rrc); the odd ones it receives into
    scratch, and a local thread block copies its input to its output and adds each (cpy, then re
    waiting on the receive). In place the root's output is its input: no copy."""
    out = "i" if in_place else "o"
    chain = [(root + 1 + j) % ranks for j in range(ranks)]
    lanes = [list(range(c, chunks, 2)) for c in (0, 1)]
    gpus = []
    for j, r in enumerate(chain):
        blocks = []
        for chan, lane in enumerate(lanes):
            send = chain[j + 1] if j + 1 < ranks else -1
            recv = chain[j - 1] if j else -1
            tb = f'id="{chan}" send="{send}" recv="{recv}" chan="{chan}"'
            if j == 0:
                steps = [step(n, "s", ("i", k), ("i", k)) for n, k in enumerate(lane)]
            elif r != root:
                steps = [step(n, "rrs", ("i", k), ("i", k)) for n, k in enumerate(lane)]
            elif chan == 0:
                steps = [step(n, "rrc", ("i", k), (out, k)) for n, k in enumerate(lane)]
            else:
                steps = [step(n, "r", ("s", n), ("s", n), hasdep=1) for n in range(len(lane))]
            blocks.append((tb, steps))
        scratch = 0
        if r == root:
            steps = []
            for n, k in enumerate(lanes[1]):
                if not in_place:
                    steps.append(step(len(steps), "cpy", ("i", k), (out, k)))
                steps.append(step(len(steps), "re", ("s", n), (out, k), dep=(1, n)))
            blocks.append(('id="2" send="-1" recv="-1" chan="0"', steps))
            scratch = len(lanes[1])
        o_chunks = chunks if r == root and not in_place else 0
        attrs = f'id="{r}" i_chunks="{chunks}" o_chunks="{o_chunks}" s_chunks="{scratch}"'
        gpus.append((attrs, blocks))
    header = (
        f'name="chain_reduce{ranks}" proto="Simple" nchannels="2" nchunksperloop="{chunks}" '
        f'ngpus="{ranks}" coll="reduce" inplace="{int(in_place)}"'
    )
    return algo_xml(header, gpus)


def open_root_reduce_xml(ranks: int) -> str:
    """An in-place chain reduce into rank ranks - 2 whose ranks on the way keep their partial
    sums in their buffer (rrcs): all but the chain's first write it, so any could be the root."""
    return chain_reduce_xml(ranks, ranks - 2, in_place=True).replace('type="rrs"', 'type="rrcs"')


def copy_allgather_xml(ranks: int, in_place: bool = False, copies: bool = True) -> str:
    """An allgather in the form SCCL's and TACCL's ncclize write: each rank's own block reaches
    its output by a <copy> before the thread blocks start (ncclize's old format: no outofplace,
    minBytes or maxBytes; a redop), and a thread block per peer sends the block from the output,
    so after the copy, and receives the peer's. In place the copy is onto itself."""
    gpus = []
    for r in range(ranks):
        blocks = []
        for b, p in enumerate(x for x in range(ranks) if x != r):
            steps = [step(0, "s", ("o", r), ("o", r)), step(1, "r", ("o", p), ("o", p))]
            blocks.append((f'id="{b}" send="{p}" recv="{p}" chan="0"', steps))
        gpus.append((f'id="{r}" i_chunks="1" o_chunks="{ranks}" s_chunks="0"', blocks))
    header = (
        f'name="copies{ranks}" nchannels="1" nchunksperloop="{ranks}" proto="Simple" '
        f'coll="allgather" inplace="{int(in_place)}" redop="nop" ngpus="{ranks}"'
    )
    text = algo_xml(header, gpus)
    for r in range(ranks):
        gpu = f'<gpu id="{r}" i_chunks="1" o_chunks="{ranks}" s_chunks="0">'
        text = text.replace(gpu, gpu + f'<copy i_off="0" o_off="{r}"/>' * copies)
    return text


def load(tmp_path, text: str, **options) -> topo.Algorithm:
    path = tmp_path / "algo.xml"
    path.write_text(text)
    return topo.load_msccl(path, **options)


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


def idle_blocks(blocks: int) -> str:
    """A 2-rank in-place allreduce file whose gpus hold `blocks` thread blocks of one nop."""
    tbs = [
        (f'id="{b}" send="-1" recv="-1" chan="0"', [step(0, "nop", cnt=0)]) for b in range(blocks)
    ]
    gpus = [(f'id="{r}" i_chunks="2" o_chunks="0" s_chunks="0"', tbs) for r in range(2)]
    return algo_xml('nchunksperloop="2" ngpus="2" coll="allreduce" inplace="1"', gpus)


def on_chan(chan: int):
    return lambda rank, blocks: [(tb.replace('chan="0"', f'chan="{chan}"'), s) for tb, s in blocks]


@pytest.mark.parametrize(
    "text,message",
    [
        (
            lambda: ring_xml(3, lambda r, s: [dict(x, cnt=72) if x["s"] == 2 else x for x in s]),
            "<gpu id=0> <tb id=0> <step s=2>: cnt=72: MSCCL's runtime takes counts below 72",
        ),
        (
            lambda: ring_xml(
                3, lambda r, s: s + [step(len(s) + i, "nop", cnt=0) for i in range(252)]
            ),
            "<gpu id=0> <tb id=0>: has 257 steps, where MSCCL's runtime takes at most 256",
        ),
        (
            lambda: allpairs_xml(3, on_chan(33)),
            "<gpu id=0> <tb id=0>: chan=33: MSCCL's runtime takes chans 0..32",
        ),
        (
            lambda: allpairs_xml(34),
            "<gpu id=0> <tb id=32>: sends on chan=0 after 32 other thread blocks, where MSCCL's "
            "runtime takes 32 a chan",
        ),
        (
            lambda: idle_blocks(1025),
            "<gpu id=0>: has 1025 thread blocks; MSCCL's runtime takes 1024",
        ),
    ],
    ids=["cnt", "steps", "chan", "blocks-per-chan", "blocks"],
)
def test_files_past_msccls_runtime_limits_are_refused(tmp_path, text, message):
    """MSCCL's parser refuses them (and NCCL runs in its place); the importer names the limit."""
    with pytest.raises(topo.AlgorithmError, match=message.replace("(", r"\(")):
        load(tmp_path, text())


def test_files_at_msccls_runtime_limits_are_taken(tmp_path):
    assert len(load(tmp_path, idle_blocks(1024)).programs[0].channels) == 1024
    longest = ring_xml(3, lambda r, s: s + [step(len(s) + i, "nop", cnt=0) for i in range(251)])
    assert len(load(tmp_path, longest).programs[0].channels[0].steps) == 256
    assert topo.check(load(tmp_path, allpairs_xml(33))).ok


def test_files_that_are_not_algorithms_are_refused(tmp_path):
    with pytest.raises(topo.AlgorithmError, match="not XML"):
        load(tmp_path, "<algo")
    with pytest.raises(
        topo.AlgorithmError,
        match="<algo>: coll='gather': the importer takes allreduce, allgather, reduce_scatter, "
        "reducescatter, alltoall, broadcast, reduce$",
    ):
        load(tmp_path, ring_xml(3).replace('coll="allreduce"', 'coll="gather"'))
    with pytest.raises(
        topo.AlgorithmError, match="<algo>: missing attribute 'coll': name the collective, one of"
    ):
        load(tmp_path, ring_xml(3).replace(' coll="allreduce"', ""))
    with pytest.raises(topo.AlgorithmError, match="<gpu id=0>: <op> inside a <gpu>"):
        load(tmp_path, ring_xml(3).replace('<tb id="0"', '<op/><tb id="0"', 1))
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
    assert [s.name for s in local] == ["copy"] + ["nop"] * (ranks - 2) + ["reduce"] * (ranks - 1)
    waits = [[(b, 1)] for b in range(ranks - 1)] + [[]] * (ranks - 2)
    assert [s.deps for s in local[1:]] == waits
    assert program.channels[0].steps[2].deps == [(ranks - 1, 2 * ranks - 3)]
    report = topo.check(algo)
    assert report.ok, report
    assert topo.check(load(tmp_path, pair_rrc_xml())).ok


def test_sccl_copies_run_first_and_in_place_are_empty(tmp_path):
    """<copy i_off o_off> (SCCL's and TACCL's ncclize): a copy step in a channel after the
    thread blocks', which every block's first step waits for; without it the output misses the
    rank's own block. In place it is a copy onto itself: an empty step."""
    algo = load(tmp_path, copy_allgather_xml(3))
    assert (algo.collective, algo.count, algo.in_place) == ("allgather", 1, False)
    program = algo.programs[1]
    assert len(program.channels) == 3
    copy = program.channels[-1].steps
    assert [(s.name, s.local, s.dst) for s in copy] == [
        ("copy", Span("input", 0, 1), Span("output", 1, 1))
    ]
    assert [ch.steps[0].deps for ch in program.channels[:-1]] == [[(2, 0)], [(2, 0)]]
    report = topo.check(algo)
    assert report.ok, report
    report = topo.check(load(tmp_path, copy_allgather_xml(3, copies=False)))
    assert not report.ok and "misses rank 0's input[0]" in report.errors[0].text, report

    algo = load(tmp_path, copy_allgather_xml(3, in_place=True))
    assert algo.in_place and [s.name for s in algo.programs[2].channels[-1].steps] == ["nop"]
    report = topo.check(algo)
    assert report.ok, report

    with pytest.raises(
        topo.AlgorithmError, match="<gpu id=0> <copy i_off=x o_off=0>: i_off='x' is not an integer"
    ):
        load(tmp_path, copy_allgather_xml(3).replace('i_off="0"', 'i_off="x"', 1))


def test_two_thread_blocks_on_one_connection_are_refused(tmp_path):
    def both_from_1(rank, blocks):
        if rank == 0:  # block 1 receives from rank 1 on chan 0 too, where block 0 does
            blocks[1] = (blocks[1][0].replace('recv="2"', 'recv="1"'), blocks[1][1])
        return blocks

    with pytest.raises(
        topo.AlgorithmError,
        match="<gpu id=0>: thread blocks 0 and 1 both recv with recv=1 on chan=0: MSCCL's "
        "runtime gives a peer one connection per chan.* give one of them another chan",
    ):
        load(tmp_path, allpairs_xml(3, both_from_1))


def case_run_files(ctx, paths, factor):
    """Each file's algorithm on these ranks, each element standing for ``factor``, against
    numpy: the sum of the inputs (a reduce's root; other outputs stay as they were, in place
    anything), the root's data everywhere (a broadcast: no input, the data starts in the
    root's output; the others' outputs start as other data), or every rank's input one after
    the other (an allgather, out of place)."""
    wrong = []
    for path in paths:
        algo = topo.load_msccl(path)
        n, r = ctx.size, ctx.rank
        rng = np.random.default_rng(7)
        data = [rng.integers(-50, 50, algo.count * factor).astype(np.float32) for _ in range(n)]
        out = np.full(algo.count * factor, np.nan, dtype=np.float32)
        buf, expected = data[r], out.copy()
        if algo.collective == "broadcast":
            buf, out, expected = np.empty(0, np.float32), data[r].copy(), data[algo.root]
        elif algo.collective == "allgather":
            out, expected = np.full(n * algo.count * factor, np.nan, np.float32), np.hstack(data)
        elif algo.collective == "allreduce" or r == algo.root:
            expected = sum(data)
        elif algo.in_place:
            expected = None
        if algo.in_place:
            buf = out = data[r].copy()
        topo.run(algo, ctx.comm, buf, out)
        if expected is not None and not np.array_equal(out, expected, equal_nan=True):
            wrong.append(f"rank {r}: {Path(path).name} x{factor}: {out} != {expected}")
    return wrong


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_they_run_on_real_ranks(tmp_path, pools, transport):
    paths = []
    for name, text in [("allpairs3.xml", allpairs_xml(3)), ("copies3.xml", copy_allgather_xml(3))]:
        paths.append(tmp_path / name)
        paths[-1].write_text(text)
    for factor in (1, 7):
        assert pools.get(3, transport).run(case_run_files, paths, factor) == [[], [], []]
    pair = tmp_path / "pair.xml"
    pair.write_text(pair_rrc_xml())
    assert pools.get(2, transport).run(case_run_files, [pair], 5) == [[], []]


@pytest.mark.parametrize("in_place", [False, True], ids=["apart", "in_place"])
@pytest.mark.parametrize("ranks,root", [(3, 1), (5, 2)])
def test_a_broadcast_and_a_reduce_import_with_their_root_and_pass(tmp_path, ranks, root, in_place):
    algo = load(tmp_path, tree_broadcast_xml(ranks, root, in_place))
    # weft's broadcast has one buffer, the output, where the root's data starts, in place or not
    assert (algo.collective, algo.root, algo.count, algo.in_place) == ("broadcast", root, 3, False)
    assert all(sizes["input"] == 0 for sizes in map(algo.buffer_counts, range(ranks)))
    sends = algo.programs[root].channels[0].steps
    assert [(s.name, s.local) for s in sends] == [("send", Span("output", k, 1)) for k in range(3)]
    if not in_place:  # the root's copy of its input to its output is the identity now
        assert [s.name for s in algo.programs[root].channels[-1].steps] == ["nop"]
    report = topo.check(algo)
    assert report.ok, report
    assert load(tmp_path, tree_broadcast_xml(ranks, root, in_place), root=root).root == root

    algo = load(tmp_path, chain_reduce_xml(ranks, root, in_place))
    assert (algo.collective, algo.root, algo.count, algo.in_place) == ("reduce", root, 4, in_place)
    local = algo.programs[root].channels[2].steps
    assert [s.name for s in local] == (["reduce"] * 2 if in_place else ["copy", "reduce"] * 2)
    assert [s.deps for s in local if s.name == "reduce"] == [[(1, 0)], [(1, 1)]]
    report = topo.check(algo)
    assert report.ok, report


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_broadcast_and_a_reduce_run_on_real_ranks(tmp_path, pools, transport):
    for ranks, bcast_root, reduce_root in ((3, 1, 2), (5, 2, 3)):
        paths = []
        for in_place in (False, True):
            for name, text in (
                ("bcast", tree_broadcast_xml(ranks, bcast_root, in_place)),
                ("reduce", chain_reduce_xml(ranks, reduce_root, in_place)),
            ):
                paths.append(tmp_path / f"{name}{ranks}_{in_place}.xml")
                paths[-1].write_text(text)
        for factor in (1, 4):
            assert pools.get(ranks, transport).run(case_run_files, paths, factor) == [[]] * ranks


def test_a_root_the_program_does_not_bear_out_is_refused(tmp_path):
    def readers(text):  # rank 3 sends its second child chunk 0 from its input, not its output
        return text.replace('type="s" srcbuf="o" srcoff="0"', 'type="s" srcbuf="i" srcoff="0"', 1)

    with pytest.raises(
        topo.AlgorithmError,
        match=r"<algo>: ranks 2 \(<gpu id=2> <tb id=0> <step s=0>\) and 3 \(<gpu id=3> <tb id=1> "
        r"<step s=0>\) read their input, so the root is ambiguous: a broadcast's root is the one "
        "rank that reads its input",
    ):
        load(tmp_path, readers(tree_broadcast_xml(5, 2)))
    with pytest.raises(topo.AlgorithmError, match="<algo>: no rank reads its input"):
        load(tmp_path, tree_broadcast_xml(5, 2).replace('srcbuf="i"', 'srcbuf="o"'))
    with pytest.raises(
        topo.AlgorithmError,
        match=r"<algo>: root=0 contradicts the program: rank 0 never reads its input, rank 2 "
        r"\(<gpu id=2> <tb id=0> <step s=0>\) does",
    ):
        load(tmp_path, tree_broadcast_xml(5, 2), root=0)
    with pytest.raises(topo.AlgorithmError, match="<algo>: root=5 is not a rank of 5"):
        load(tmp_path, tree_broadcast_xml(5, 2), root=5)
    with pytest.raises(
        topo.AlgorithmError, match="<algo>: root=0 was given, but allreduce has no root"
    ):
        load(tmp_path, ring_xml(3), root=0)
    # Out of place, MSCCL's root sending from its output sends what was there before the call.
    uncopied = tree_broadcast_xml(5, 2).replace('type="cpy"', 'type="nop"')
    uncopied = uncopied.replace('srcbuf="i" srcoff="0"', 'srcbuf="o" srcoff="0"', 1)
    with pytest.raises(
        topo.AlgorithmError,
        match=r"<gpu id=2> <tb id=0> <step s=0>: the root reads its output where none of its "
        "steps writes it",
    ):
        load(tmp_path, uncopied)
    no_input = tree_broadcast_xml(5, 2).replace('id="2" i_chunks="3"', 'id="2" i_chunks="0"')
    with pytest.raises(
        topo.AlgorithmError, match=r"<gpu id=2>: i_chunks=0, but the broadcast's root needs 3"
    ):
        load(tmp_path, no_input)

    nowhere = chain_reduce_xml(3, 1).replace('dstbuf="o"', 'dstbuf="s"')
    with pytest.raises(
        topo.AlgorithmError,
        match="<algo>: no rank writes its output: a reduce's root is the rank whose output "
        "receives the result",
    ):
        load(tmp_path, nowhere)
    with pytest.raises(
        topo.AlgorithmError,
        match=r"<algo>: root=0 contradicts the program: rank 0 never writes its output, rank 1 "
        r"\(<gpu id=1> <tb id=0> <step s=0>\) does",
    ):
        load(tmp_path, chain_reduce_xml(3, 1), root=0)
    with pytest.raises(
        topo.AlgorithmError, match=r"<gpu id=1>: o_chunks=0, but the reduce's root needs 4"
    ):
        load(tmp_path, chain_reduce_xml(3, 1).replace('o_chunks="4"', 'o_chunks="0"'))
    with pytest.raises(
        topo.AlgorithmError, match="<gpu id=2>: a reduce needs o_chunks equal to i_chunks"
    ):
        load(tmp_path, chain_reduce_xml(3, 1).replace('o_chunks="0"', 'o_chunks="2"', 1))

    # In place, a rank on the way that also keeps the partial sum in its buffer is a reduce all
    # the same (weft's reduce leaves the others' buffers to them), but which rank is the root?
    keeps = chain_reduce_xml(5, 3, in_place=True).replace('type="rrs"', 'type="rrcs"')
    with pytest.raises(
        topo.AlgorithmError,
        match=r"ranks 0 \(.*\), 1 \(.*\), 2 \(.*\) and 3 \(.*\) write their output, so the "
        "in-place reduce's root is ambiguous: give root=",
    ):
        load(tmp_path, keeps)
    algo = load(tmp_path, keeps, root=3)
    assert algo.root == 3 and topo.check(algo).ok
    report = topo.check(load(tmp_path, keeps, root=1))  # a rank the sums pass through
    assert not report.ok and all(e.rank == 1 and "misses" in e.text for e in report.errors), report


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
        if rank == 1:  # the reductions wait for a receive that waits for them
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


def test_dependencies_are_released_as_msccls_runtime_releases_them(tmp_path):
    """A thread block raises its flag after a transfer marked hasdep=1, never after a nop, and a
    waiter on step s waits for the first marked transfer from s on (here a peer's receive of
    the sum, which waits for the reduction: a deadlock the checker names); a nop's dependency
    passes to the next transfer, which must have a depid of its own; a nop without one counts
    no place in the block. What the runtime would wait on forever, or reject, is refused."""

    def marks_later(rank, blocks):
        if rank == 0:  # the receive into scratch unmarked, the receive of the sum marked
            blocks[1][1][1]["hasdep"], blocks[1][1][3]["hasdep"] = 0, 1
        return blocks

    algo = load(tmp_path, allpairs_xml(3, marks_later))
    assert algo.programs[0].channels[2].steps[2].deps == [(1, 3)]
    report = topo.check(algo)
    assert [e.text for e in report.errors] == [
        "deadlock: rank 0 channel 2 step 2 waits for its channel 1 to finish step 3; "
        "rank 0 channel 1 step 2 waits for its channel 2 to finish step 3"
    ], report

    def unmarked(rank, blocks):
        if rank == 2:
            blocks[1][1][1]["hasdep"] = 0
        return blocks

    with pytest.raises(
        topo.AlgorithmError,
        match=r"<gpu id=2> <tb id=2> <step s=2>: depends on step 1 of thread block 1, but no "
        r"transfer of that block from there on has hasdep=1 \(a nop raises no flag\)",
    ):
        load(tmp_path, allpairs_xml(3, unmarked))

    def sum_marked_by_a_nop(rank, blocks):
        if rank == 1:  # the peers wait on a nop after the last reduction
            steps = blocks[-1][1]
            steps[-1]["hasdep"] = 0
            steps.append(step(len(steps), "nop", cnt=0, hasdep=1))
            for _, peer_steps in blocks[:-1]:
                peer_steps[2]["deps"] = len(steps) - 1
        return blocks

    never = r"<gpu id=1> <tb id=0> <step s=2>: depends on step 4 of thread block 2, but no "
    with pytest.raises(topo.AlgorithmError, match=never + r"transfer .*\(a nop raises no flag\)"):
        load(tmp_path, allpairs_xml(3, sum_marked_by_a_nop))

    def nothing_carries_the_nops(rank, blocks):
        if rank == 0:
            blocks[-1][1][2].update(depid=-1, deps=-1)  # the first re
        return blocks

    inherits = "<gpu id=0> <tb id=2> <step s=2>: takes the dependency of the nop at s=1 but "
    with pytest.raises(topo.AlgorithmError, match=inherits + "has no depid of its own"):
        load(tmp_path, allpairs_xml(3, nothing_carries_the_nops))

    def nop_without_a_dependency(rank, blocks):
        if rank == 0:  # the local block's flag then reaches 2 where the peers wait for 3
            blocks[-1][1][1].update(depid=-1, deps=-1)
            blocks[-1][1][2].update(depid=0, deps=1)
        return blocks

    shifted = "<gpu id=0> <tb id=0> <step s=2>: depends on step 3 of thread block 2, but no"
    with pytest.raises(topo.AlgorithmError, match=shifted):
        load(tmp_path, allpairs_xml(3, nop_without_a_dependency))

    with pytest.raises(topo.AlgorithmError, match="<step s=1>: hasdep='yes': use 0 or 1"):
        load(tmp_path, allpairs_xml(3).replace('hasdep="1"', 'hasdep="yes"', 1))
    with pytest.raises(topo.AlgorithmError, match="depends on step 9 of thread block 0, which has"):
        load(tmp_path, allpairs_xml(3).replace('deps="1"', 'deps="9"', 1))


def test_the_command_line_takes_a_root(tmp_path, capsys):
    """--root on check, simulate and draw: an MSCCL file's root is checked against it and an
    in-place reduce that leaves its root open is loaded with it (without, AmbiguousRoot names
    the ranks); a collective without a root refuses it in load_msccl's words; a JSON file's
    root is checked; a family is planned for it."""
    from weft.topo.__main__ import main
    from weft.topo.msccl import AmbiguousRoot

    files = {
        "open.xml": open_root_reduce_xml(5),
        "bcast.xml": tree_broadcast_xml(5, 2),
        "ring.xml": ring_xml(5),
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    open_root, bcast, ring = (str(tmp_path / name) for name in files)
    with pytest.raises(AmbiguousRoot) as refused:
        topo.load_msccl(open_root)
    assert refused.value.roots == [0, 1, 2, 3]
    assert main(["check", open_root]) == 1
    assert "root is ambiguous: give root= (--root R)" in capsys.readouterr().out
    assert main(["check", open_root, "--root", "3"]) == 0
    assert f"{open_root}: chain_reduce5 on 5 ranks: ok" in capsys.readouterr().out
    assert main(["check", bcast, "--root", "1"]) == 1
    assert "<algo>: root=1 contradicts the program: rank 1 never reads" in capsys.readouterr().out
    assert main(["check", ring, "--root", "0"]) == 1
    assert "<algo>: root=0 was given, but allreduce has no root" in capsys.readouterr().out
    saved = tmp_path / "bcast.json"
    topo.builtin("broadcast", "tree", 5, root=2, count=3).save(saved)
    assert main(["check", str(saved), "--root", "2"]) == 0
    assert main(["check", str(saved), "--root", "1"]) == 1
    assert "top level: root=1 was given, but the file's root is 2" in capsys.readouterr().out
    assert main(["simulate", open_root, "--root", "3", "--topology", "ring:5"]) == 0
    assert main(["simulate", open_root, "--topology", "ring:5"]) == 1
    assert "give root= (--root R)" in capsys.readouterr().err
    family = ["simulate", "tree", "--collective", "broadcast", "--topology", "switch:5"]
    assert main([*family, "--bytes", "4K", "--root", "3"]) == 0
    with pytest.raises(SystemExit):
        main(["draw", "topology", "ring:5", "--root", "1", "-o", str(tmp_path / "t.png")])
    assert "--root is for draw timeline" in capsys.readouterr().err
