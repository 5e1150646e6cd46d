"""MSCCL's algorithm XML as an Algorithm: ``topo.load_msccl(path)``.

The format (written by msccl-tools' ``ir_to_xml``, read by msccl-executor-nccl's parser):
``<algo>`` with ``ngpus``, ``coll``, ``nchunksperloop``, ``inplace`` and, in newer files,
``outofplace``, ``minBytes``, ``maxBytes``; per rank a ``<gpu id i_chunks o_chunks s_chunks>``;
per thread block a ``<tb id send recv chan>``; per step ``<step s type srcbuf srcoff dstbuf dstoff
cnt depid deps hasdep>``. Thread blocks become channels (``chan`` their tag, so a block's sends
reach the block of the same chan on the peer); chunks become elements, so the Algorithm is for
calls of one element per chunk (a real call divides its buffer into that many chunks). Anything
the importer cannot represent is an error naming the element, never a skipped step.

Files that SCCL's and TACCL's ``ncclize`` write may also hold ``<copy i_off o_off>`` in a
``<gpu>``: a chunk of the input that is also a chunk of the output, copied there before the
algorithm starts. Each becomes a copy step in one more channel of that rank (after the thread
blocks' channels), which every thread block waits for before its first step.

A broadcast's or a reduce's file says nothing of its root: it is written for one, which the
importer reads off what the ranks do with their buffers (``_root``), or is given and checked.
An in-place reduce that several ranks write leaves it open: loading it without a root raises
``AmbiguousRoot``, which names the ranks that may be it.
"""

from __future__ import annotations

import xml.etree.ElementTree as ElementTree
from dataclasses import replace
from pathlib import Path

from weft.topo.algorithm import (
    ROOTED,
    Algorithm,
    AlgorithmError,
    Channel,
    RankProgram,
    Span,
    Step,
    load,
)

BUFFERS = {"i": "input", "o": "output", "s": "scratch"}
COLLECTIVES = {
    "allreduce": "allreduce",
    "allgather": "allgather",
    "reduce_scatter": "reduce_scatter",
    "reducescatter": "reduce_scatter",
    "alltoall": "alltoall",
    "broadcast": "broadcast",
    "reduce": "reduce",
}
# Step type -> (receives, reads src, writes dst, sends)
STEP_TYPES = {
    "s": (False, True, False, True),
    "r": (True, False, True, False),
    "rcs": (True, False, True, True),
    "rrs": (True, True, False, True),
    "rrc": (True, True, True, False),
    "rrcs": (True, True, True, True),
    "cpy": (False, True, True, False),
    "re": None,  # dst = dst (op) src, locally
    "nop": None,  # no data: its dependency holds the block's next step
}


# What MSCCL's runtime parser refuses in every version of it (msccl-executor-nccl's limits;
# RCCL's are lower: 64 steps and 64 thread blocks). A file past them is not an algorithm MSCCL
# runs (it falls back to NCCL), so the importer refuses it too, naming the limit.
MSCCL_MAX_STEPS = 256  # per thread block (MSCCL_MAX_NUM_STEPS)
MSCCL_MAX_COUNT = 72  # a step's cnt stays below it (MSCCL_MAX_COUNT)
MSCCL_MAX_CHANNEL = 32  # the highest chan (NCCL's MAXCHANNELS)
MSCCL_MAX_BLOCKS_PER_CHANNEL = 32  # thread blocks of a gpu that send (or receive) on one chan
MSCCL_MAX_BLOCKS = 1024  # thread blocks of a gpu


class AmbiguousRoot(AlgorithmError):
    """An in-place reduce whose program lets any of several ranks be the root (each writes its
    buffer): ``roots`` are those ranks; load it with ``root=`` one of them."""

    def __init__(self, message: str, roots: list[int]):
        super().__init__(message)
        self.roots = roots


def load_msccl(path, *, elem_size: int = 4, root: int | None = None) -> Algorithm:
    """Reads an MSCCL algorithm file; raises AlgorithmError naming the element that is wrong.
    ``root``: a broadcast's or reduce's root, checked against the program (by default inferred
    from it; an in-place reduce that several ranks write needs it, and raises AmbiguousRoot
    without it)."""
    source = str(path)
    try:
        top = ElementTree.fromstring(Path(path).read_text())
    except ElementTree.ParseError as e:
        raise AlgorithmError(f"{source}: not XML: {e}") from None
    return _convert(top, source, elem_size, root)


def load_file(path, *, root: int | None = None) -> Algorithm:
    """An Algorithm file: MSCCL's XML by its ``.xml`` suffix, weft.topo's JSON otherwise.
    ``root``: a broadcast's or reduce's root, as ``load_msccl`` takes it; a JSON file states its
    own, which ``root`` is checked against."""
    if Path(path).suffix == ".xml":
        return load_msccl(path, root=root)
    algo = load(path)
    fault = _root_fault(algo.collective, root, algo.root)
    if fault:
        raise AlgorithmError(f"{path}: top level: {fault}")
    return algo


def _root_fault(collective: str, given: int | None, own: int | None = None) -> str | None:
    """What is wrong with a root given for a file of ``collective`` (whose own root is ``own``
    where the file states it), or None."""
    if given is None:
        return None
    if collective not in ROOTED:
        return f"root={given} was given, but {collective} has no root"
    if own is not None and given != own:
        return f"root={given} was given, but the file's root is {own}"
    return None


def _convert(top, source: str, elem_size: int, given_root: int | None) -> Algorithm:
    def fail(where: str, what: str, roots: list[int] | None = None):
        """Raises AlgorithmError, or AmbiguousRoot where ``roots`` may each be the root."""
        message = f"{source}: {where}: {what}"
        raise AlgorithmError(message) if roots is None else AmbiguousRoot(message, roots)

    def number(element, key: str, where: str, lowest: int = 0) -> int:
        value = element.get(key)
        if value is None:
            fail(where, f"missing attribute {key!r}")
        try:
            parsed = int(value)
        except ValueError:
            fail(where, f"{key}={value!r} is not an integer")
        if parsed < lowest:
            fail(where, f"{key}={parsed} is below {lowest}")
        return parsed

    if top.tag != "algo":
        fail("top level", f"<{top.tag}> where <algo> was expected")
    ranks = number(top, "ngpus", "<algo>", 1)
    coll = top.get("coll")
    if coll is None:
        fail(
            "<algo>",
            f"missing attribute 'coll': name the collective, one of {', '.join(COLLECTIVES)}",
        )
    if coll not in COLLECTIVES:
        fail("<algo>", f"coll={coll!r}: the importer takes {', '.join(COLLECTIVES)}")
    collective = COLLECTIVES[coll]
    fault = _root_fault(collective, given_root)
    if fault:
        fail("<algo>", fault)
    chunks_per_loop = number(top, "nchunksperloop", "<algo>", 1)
    in_place = number(top, "inplace", "<algo>") == 1
    if in_place and collective == "alltoall":
        fail("<algo>", f"an in-place {collective} has no layout the importer knows")
    if top.get("outofplace") is not None and (number(top, "outofplace", "<algo>") == 1) == (
        in_place
    ):
        fail("<algo>", "inplace and outofplace must disagree")

    gpus = top.findall("gpu")
    unknown = {child.tag for child in top} - {"gpu"}
    if unknown:
        fail("<algo>", f"unknown element(s) {', '.join(sorted(unknown))}")
    ids = sorted(number(g, "id", "<gpu>") for g in gpus)
    # Counted before compared: ngpus is the file's claim and may be any size.
    if len(ids) != ranks or ids != list(range(ranks)):
        fail("<algo>", f"gpu ids {ids} are not 0..{ranks - 1} (ngpus={ranks})")

    count = None
    programs: list[RankProgram | None] = [None] * ranks
    tbs = [0] * ranks  # thread blocks per rank; a channel of its <copy> elements follows them
    sizes: list[dict] = [{}] * ranks
    for gpu in gpus:
        rank = number(gpu, "id", "<gpu>")
        where = f"<gpu id={rank}>"
        chunks = sizes[rank] = {b: number(gpu, f"{b}_chunks", where) for b in BUFFERS}
        rank_count = _call_count(collective, ranks, chunks, in_place, where, fail)
        if count is not None and rank_count != count:
            fail(where, f"implies {rank_count} chunks per call, other ranks {count}")
        count = rank_count
        blocks = gpu.findall("tb")
        for child in gpu:
            if child.tag not in ("tb", "copy"):
                fail(where, f"<{child.tag}> inside a <gpu>, which holds <tb> and <copy> elements")
        tb_ids = [number(tb, "id", f"{where} <tb>") for tb in blocks]
        tbs[rank] = len(blocks)
        if len(blocks) > MSCCL_MAX_BLOCKS:
            fail(
                where, f"has {len(blocks)} thread blocks; MSCCL's runtime takes {MSCCL_MAX_BLOCKS}"
            )
        if tb_ids != list(range(len(blocks))):
            fail(where, f"thread block ids {tb_ids} are not 0..{len(blocks) - 1} in order")
        place = _in_place_layout(collective, rank, rank_count) if in_place else _apart
        channels = [
            _channel(tb, rank, ranks, len(blocks), where, number, fail, place) for tb in blocks
        ]
        if not channels:
            fail(where, "has no thread block")
        for side in ("send", "recv"):  # one thread block per (peer, chan) and direction
            seen = {}
            _blocks_per_channel(blocks, side, where, fail)
            for tb in blocks:
                key = (tb.get(side), tb.get("chan"))
                if key[0] != "-1" and key in seen:
                    fail(
                        where,
                        f"thread blocks {seen[key]} and {tb.get('id')} both {side} "
                        f"with {side}={key[0]} on chan={key[1]}: MSCCL's runtime gives a peer "
                        "one connection per chan, and two thread blocks on it would each count "
                        "its messages from the start, reading or overwriting each other's; "
                        "give one of them another chan",
                    )
                seen[key] = tb.get("id")
        _release_dependencies(gpu, channels, where, fail)
        programs[rank] = RankProgram(channels, scratch=chunks["s"])
        copies = [_copy(element, where, number, place) for element in gpu.findall("copy")]
        if copies:
            # They run first: every thread block's first step waits for the last of them.
            for channel in channels:
                if channel.steps:
                    channel.steps[0].deps.append((len(channels), len(copies) - 1))
            channels.append(Channel(copies))
        if max(chunks["i"], chunks["o"]) > chunks_per_loop:
            fail(where, f"a buffer has more chunks than nchunksperloop={chunks_per_loop}")
    root = 0
    if collective in ROOTED:
        root = _root(collective, programs, in_place, given_root, fail, tbs)
        # Out of place, the buffer only the root needs must hold the call's chunks there.
        other = "i" if collective == "broadcast" else "o"
        if not in_place and sizes[root][other] != count:
            fail(
                f"<gpu id={root}>",
                f"{other}_chunks={sizes[root][other]}, but the {collective}'s root needs {count}",
            )
    if collective == "broadcast":
        # weft's broadcast has no input: the root's data starts in its output, in place or not.
        for r in range(ranks):
            if in_place or r == root:
                programs[r] = _input_as_output(programs[r])
    return Algorithm(
        name=top.get("name") or Path(source).stem,
        collective=collective,
        ranks=ranks,
        count=count,
        programs=programs,
        root=root,
        in_place=in_place and collective != "broadcast",
        elem_size=elem_size,
        slot_bytes=elem_size,  # a chunk per message
    )


def _release_dependencies(gpu, channels: list[Channel], where: str, fail) -> None:
    """Makes each dependency of the thread blocks' `channels` on a step of another block the
    step MSCCL's runtime waits for. Its thread blocks run transfers (every step but nop) and
    raise their flag after a transfer marked hasdep=1, to that transfer's place in the block
    (its s, less one for each earlier nop without a depid); a waiter on step s waits for the
    flag to reach s: for the first marked transfer there or later. A dependency that none
    releases is refused (the runtime would wait forever), as is a nop's dependency that the
    runtime rejects (_flags)."""
    tbs = gpu.findall("tb")
    flags = [_flags(tb, f"{where} <tb id={c}>", fail) for c, tb in enumerate(tbs)]

    def released(at: str, block: int, index: int) -> tuple[int, int]:
        if index >= len(tbs[block]):
            fail(at, f"depends on step {index} of thread block {block}, which has "
                     f"{len(tbs[block])} steps")  # fmt: skip
        for value, step in flags[block]:
            if value >= index:
                return block, step
        fail(
            at,
            f"depends on step {index} of thread block {block}, but no transfer of that block "
            "from there on has hasdep=1 (a nop raises no flag): MSCCL's runtime would wait for "
            "it forever",
        )

    for c, channel in enumerate(channels):
        for i, step in enumerate(channel.steps):
            step.deps = [released(f"{where} <tb id={c}> <step s={i}>", *dep) for dep in step.deps]


def _flags(tb, where: str, fail) -> list[tuple[int, int]]:
    """(value, s) of each time thread block `tb` raises its flag in MSCCL's runtime, in order.
    A nop's dependency passes to the block's next transfer, which the runtime requires to have
    a depid of its own (it keeps the nop's in place of the nop)."""
    flags, skipped, inherited = [], 0, None
    for index, element in enumerate(tb):
        has_dep = int(element.get("depid", "-1")) >= 0
        if element.get("type") == "nop":
            if has_dep and inherited is None:
                inherited = index
            skipped += not has_dep
            continue
        if inherited is not None and not has_dep:
            fail(
                f"{where} <step s={index}>",
                f"takes the dependency of the nop at s={inherited} but has no depid of its own, "
                "which MSCCL's runtime refuses: give it one",
            )
        inherited = None
        if element.get("hasdep") == "1":
            flags.append((index - skipped, index))
    return flags


def _call_count(collective, ranks, chunks, in_place, where, fail) -> int:
    """The chunks of a call (per rank, or per block), from a gpu's buffer sizes."""
    i, o = chunks["i"], chunks["o"]
    if collective == "allreduce":
        if o not in (0, i) or (o == 0 and not in_place):
            fail(where, f"an allreduce needs o_chunks equal to i_chunks ({i}), or 0 in place")
        return i
    if collective == "allgather":
        if o != ranks * i and not (in_place and i == 0):
            fail(where, f"an allgather of {ranks} ranks needs o_chunks = {ranks} x i_chunks")
        if o % ranks:
            fail(where, f"o_chunks={o} is not a multiple of {ranks} ranks")
        return i or o // ranks
    if collective == "reduce_scatter":
        if i != ranks * o and not (in_place and o == 0):
            fail(where, f"a reduce_scatter of {ranks} ranks needs i_chunks = {ranks} x o_chunks")
        if i % ranks:
            fail(where, f"i_chunks={i} is not a multiple of {ranks} ranks")
        return o or i // ranks
    if collective == "broadcast":
        # Every rank's output receives the data; the input is the root's alone (checked once
        # the root is known). In place the two name one buffer, so either may be sized.
        if in_place and len({i, o} - {0}) > 1:
            fail(where, f"an in-place broadcast needs i_chunks ({i}) and o_chunks ({o}) equal or 0")
        if not in_place and i not in (0, o):
            fail(where, f"a broadcast needs i_chunks equal to o_chunks ({o}), or 0 off the root")
        return max(i, o)
    if collective == "reduce":
        if o not in (0, i):
            fail(
                where,
                f"a reduce needs o_chunks equal to i_chunks ({i}), or 0 off the root or in place",
            )
        return i
    if i % ranks or o != i and not (in_place and o == 0):
        fail(where, f"an alltoall of {ranks} ranks needs i_chunks (a multiple of {ranks}) = o")
    return i // ranks


def _apart(span: Span) -> Span:
    return span


def _in_place_layout(collective: str, rank: int, count: int):
    """In place MSCCL names one buffer two ways; weft names its parts as the executor sees
    them: the output, with the input inside it (allgather: at block `rank`; reduce_scatter: the
    output is block `rank` of the input). A broadcast's buffers are placed once its root is
    known (``_input_as_output``)."""

    def place(span: Span) -> Span:
        if collective in ("allreduce", "reduce") and span.buffer == "input":
            return Span("output", span.offset, span.count)
        if collective == "allgather" and span.buffer == "input":
            return Span("output", rank * count + span.offset, span.count)
        own = rank * count <= span.offset and span.offset + span.count <= (rank + 1) * count
        if collective == "reduce_scatter" and span.buffer == "input" and own:
            return Span("output", span.offset - rank * count, span.count)
        return span

    return place


def _root(
    collective: str, programs: list[RankProgram], in_place: bool, given, fail, tbs: list[int]
) -> int:
    """The rank a broadcast or reduce is written for, read off the program (or ``given`` and
    checked against it). weft's broadcast has no input and starts the root's data in its output,
    so the root is the one rank that reads its input (in place: a chunk of its one buffer that
    none of its steps writes). weft's reduce leaves every output but the root's as it was, so
    the root is the one rank that writes its output; in place the others may use their one
    buffer as they like, so of several that write it, ``given`` says which is the root."""
    ranks = len(programs)
    if given is not None and not 0 <= given < ranks:
        fail("<algo>", f"root={given} is not a rank of {ranks}")
    if collective == "broadcast":
        does, do = "reads its input", "read their input"
        why = "a broadcast's root is the one rank that reads its input, where its data is"
        one = ("input", "output") if in_place else ("input",)
        tests = [_reads_unwritten(p, one) for p in programs]
    else:
        does, do = "writes its output", "write their output"
        why = "a reduce's root is the rank whose output receives the result"
        tests = [_writes_output] * ranks
    found = {r: where for r, p in enumerate(programs) if (where := _first(p, r, tests[r], tbs))}
    if not found:
        fail("<algo>", f"no rank {does}: {why}")
    named = [f"{r} ({where})" for r, where in found.items()]
    named = f"ranks {', '.join(named[:-1])} and {named[-1]}" if named[1:] else f"rank {named[0]}"
    if len(found) > 1 and (collective == "broadcast" or not in_place):
        fail("<algo>", f"{named} {do}, so the root is ambiguous: {why}, and no other may")
    if len(found) > 1 and given is None:
        what = f"{named} {do}, so the in-place reduce's root is ambiguous: give root="
        fail("<algo>", what, roots=list(found))
    if given is not None and given not in found:
        verb = "do" if len(found) > 1 else "does"
        fail(
            "<algo>",
            f"root={given} contradicts the program: rank {given} never {does}, {named} {verb} "
            f"({why})",
        )
    root = next(iter(found)) if given is None else given
    if collective == "broadcast" and not in_place:
        # Out of place, MSCCL's root has its data in its input only: what it reads of its
        # output must have been written there (weft's output would hold the data already).
        test = _reads_unwritten(programs[root], ("output",))
        where = _first(programs[root], root, test, tbs)
        if where:
            fail(where, "the root reads its output where none of its steps writes it")
    return root


def _first(program: RankProgram, rank: int, test, tbs: list[int]) -> str | None:
    """The element of the program's first step, in thread block order, that passes ``test``
    (``tbs``: each rank's number of thread blocks; a channel after them holds its copies)."""
    for c, channel in enumerate(program.channels):
        for i, step in enumerate(channel.steps):
            if test(step):
                if c >= tbs[rank]:
                    return f"<gpu id={rank}>'s <copy> number {i + 1}"
                return f"<gpu id={rank}> <tb id={c}> <step s={i}>"
    return None


def _writes_output(step: Step) -> bool:
    return step.dst is not None and step.dst.buffer == "output" and step.count > 0


def _reads_unwritten(program: RankProgram, buffers: tuple[str, ...]):
    """A test: does a step read a chunk of ``buffers`` (names of one storage, by offset) that no
    step of ``program`` writes, so one the rank held before the call?"""
    written = sorted(
        (
            s.dst
            for channel in program.channels
            for s in channel.steps
            if s.dst is not None and s.dst.buffer in buffers and s.count
        ),
        key=lambda span: span.offset,
    )

    def test(step: Step) -> bool:
        read = step.local
        if read is None or read.buffer not in buffers or not step.count:
            return False
        start, end = read.offset, read.offset + read.count
        for span in written:  # intervals, not sets of chunks: a file may claim any size
            if span.offset > start:
                break
            start = max(start, span.offset + span.count)
        return start < end

    return test


def _input_as_output(program: RankProgram) -> RankProgram:
    """The program with its input's chunks named as the output's at the same offsets (a
    broadcast's root; in place, every rank); a copy of a chunk onto itself (the root's copy of
    its input to its output) becomes the empty step it now is, keeping its place and deps."""

    def moved(span: Span) -> Span:
        return Span("output", span.offset, span.count) if span.buffer == "input" else span

    channels = []
    for channel in program.channels:
        steps = []
        for step in channel.steps:
            step = replace(step, **{key: moved(span) for key, span in step.spans()})
            if step.name == "copy" and step.local == step.dst:
                step = Step(count=0, deps=step.deps)
            steps.append(step)
        channels.append(Channel(steps, channel.tag))
    return RankProgram(channels, program.scratch)


def _copy(element, where: str, number, place) -> Step:
    """A ``<copy i_off o_off>`` (SCCL's and TACCL's): input chunk i_off copied to output chunk
    o_off; a copy onto itself (in place, where the two name one chunk) is an empty step."""
    at = f"{where} <copy i_off={element.get('i_off')} o_off={element.get('o_off')}>"
    local = place(Span("input", number(element, "i_off", at), 1))
    dst = place(Span("output", number(element, "o_off", at), 1))
    if local == dst:
        return Step(count=0)
    return Step(local=local, dst=dst, count=1, copy_sends=True)


def _blocks_per_channel(blocks, side: str, where: str, fail) -> None:
    """Refuses a thread block that steps to `side` (send or recv) when MSCCL's runtime has
    already given that chan's peers of this side to as many blocks as a chan has: every
    earlier block with a `side` peer on the chan took one."""
    column = 3 if side == "send" else 0  # STEP_TYPES' sends, receives
    taken: dict[str, int] = {}
    for tb in blocks:
        if tb.get(side) == "-1":
            continue
        chan = tb.get("chan")
        uses = any((STEP_TYPES.get(step.get("type")) or (False,) * 4)[column] for step in tb)
        if uses and taken.get(chan, 0) >= MSCCL_MAX_BLOCKS_PER_CHANNEL:
            fail(
                f"{where} <tb id={tb.get('id')}>",
                f"{side}s on chan={chan} after {taken[chan]} other thread blocks, where MSCCL's "
                f"runtime takes {MSCCL_MAX_BLOCKS_PER_CHANNEL} a chan: give it another",
            )
        taken[chan] = taken.get(chan, 0) + 1


def _channel(tb, rank: int, ranks: int, blocks: int, where: str, number, fail, place) -> Channel:
    tb_id = number(tb, "id", f"{where} <tb>")
    at_tb = f"{where} <tb id={tb_id}>"
    send, recv = number(tb, "send", at_tb, -1), number(tb, "recv", at_tb, -1)
    for name, peer in (("send", send), ("recv", recv)):
        if peer >= ranks or peer == rank:
            fail(at_tb, f"{name}={peer} is not another rank of {ranks}")
    tag = number(tb, "chan", at_tb)
    if tag > MSCCL_MAX_CHANNEL:
        fail(at_tb, f"chan={tag}: MSCCL's runtime takes chans 0..{MSCCL_MAX_CHANNEL}")
    if len(tb) > MSCCL_MAX_STEPS:
        fail(
            at_tb,
            f"has {len(tb)} steps, where MSCCL's runtime takes at most {MSCCL_MAX_STEPS} a thread "
            "block: spread them over more thread blocks",
        )
    steps = []
    for index, element in enumerate(tb):
        at = f"{at_tb} <step s={element.get('s')}>"
        if element.tag != "step":
            fail(at_tb, f"<{element.tag}> inside a thread block")
        if number(element, "s", at) != index:
            fail(at, f"steps must be numbered 0, 1, ... in order; this is the {index}th")
        steps.append(_step(element, at, send, recv, tb_id, blocks, number, fail, place))
    return Channel(steps, tag)


def _step(element, at, send: int, recv: int, tb_id: int, blocks: int, number, fail, place) -> Step:
    kind = element.get("type")
    if kind not in STEP_TYPES:
        fail(at, f"type={kind!r}: the importer takes {', '.join(STEP_TYPES)}")
    cnt = number(element, "cnt", at, 0 if kind == "nop" else 1)
    if kind != "nop" and cnt >= MSCCL_MAX_COUNT:
        fail(
            at,
            f"cnt={cnt}: MSCCL's runtime takes counts below {MSCCL_MAX_COUNT}; split the step "
            "(a weft Algorithm, saved as JSON, has no such limit)",
        )

    def span(prefix):
        buffer = element.get(f"{prefix}buf")
        if buffer not in BUFFERS:
            fail(at, f"{prefix}buf={buffer!r}: use i, o or s")
        return place(Span(BUFFERS[buffer], number(element, f"{prefix}off", at), cnt))

    if element.get("hasdep") not in ("0", "1"):
        fail(at, f"hasdep={element.get('hasdep')!r}: use 0 or 1")
    depid, deps = number(element, "depid", at, -1), number(element, "deps", at, -1)
    if (depid < 0) != (deps < 0) or depid >= blocks or depid == tb_id:
        fail(
            at,
            f"depid={depid} deps={deps}: a dependency names another thread block of this gpu "
            f"(0..{blocks - 1}) and its step, or neither",
        )
    depends = [(depid, deps)] if depid >= 0 else []
    if kind == "nop":
        return Step(count=0, deps=depends)
    if kind == "re":
        return Step(kind="reduce", local=span("src"), dst=span("dst"), count=cnt, deps=depends)
    receives, reads, writes, sends = STEP_TYPES[kind]
    if receives and recv < 0:
        fail(at, f"type={kind} receives, but the thread block has recv=-1")
    if sends and send < 0:
        fail(at, f"type={kind} sends, but the thread block has send=-1")
    return Step(
        recv=recv if receives else None,
        send=send if sends else None,
        local=span("src") if reads else None,
        dst=span("dst") if writes else None,
        count=cnt,
        copy_sends=True,  # MSCCL's protocols copy into the peer's buffers
        deps=depends,
    )
