"""An Algorithm: a collective written out as every rank's steps, in the form the executor runs.

Each rank has one or more channels, each an ordered list of steps over element ranges (spans) of
the rank's input, output and scratch buffers. A step is one of the executor's three forms:

- ``fused``: one stream of ``count`` elements: received from ``recv`` (if any), reduced with
  ``local`` (if any), written to ``dst`` and/or sent to ``send``. Which parts are present makes it
  a send, recv, copy, recv_reduce, recv_copy_send, recv_reduce_send, ... (``Step.name``).
- ``exchange``: ``local`` is sent to ``send`` while ``dst`` is received from ``recv``, the two
  progressed together; with ``operand``, dst = received (op) operand. An absent span on a side
  with a peer still moves one empty message.
- ``local_reduce``: ``local`` holds k blocks of ``count`` elements; dst = their reduction.
- ``reduce``: dst = dst (op) local, ``count`` elements (MSCCL's ``re``; the executor has no such
  step yet, so only the checker runs it).

A step may wait for steps of other channels of its rank (``deps``: (channel, index) pairs).
Messages between two ranks keep their order per channel; a channel's ``tag`` (by default its
index) says which channel of the receiving rank its messages reach. Saved as JSON (``save``,
``load``); everything a file says is checked before it is believed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

FORMAT = "weft-algorithm/1"
BUFFERS = ("input", "output", "scratch")
KINDS = ("fused", "exchange", "local_reduce", "reduce")
# The collectives that have a root.
ROOTED = ("broadcast", "reduce", "gather", "scatter")
# Collectives and, for each, the element counts of (input, output) on rank r of n with root t;
# count is what the collective's call passes (per rank for allreduce, per block otherwise).
COLLECTIVES = {
    "allreduce": lambda count, n, r, t: (count, count),
    "reduce_scatter": lambda count, n, r, t: (n * count, count),
    "allgather": lambda count, n, r, t: (count, n * count),
    "broadcast": lambda count, n, r, t: (0, count),
    "reduce": lambda count, n, r, t: (count, count),
    "alltoall": lambda count, n, r, t: (n * count, n * count),
    "gather": lambda count, n, r, t: (count, n * count if r == t else 0),
    "scatter": lambda count, n, r, t: (n * count if r == t else 0, count),
    "barrier": lambda count, n, r, t: (0, 0),
}
# In place, where the input lies inside the output (or the output inside the input, for
# reduce_scatter): the offset in elements, on rank r.
IN_PLACE_OFFSET = {
    "allreduce": lambda count, r: 0,
    "reduce": lambda count, r: 0,
    "allgather": lambda count, r: r * count,
    "reduce_scatter": lambda count, r: r * count,
}


# A fused step's name by which of (recv, local, dst, send) it has.
FUSED_NAMES = {
    (True, False, True, False): "recv",
    (True, True, True, False): "recv_reduce",
    (True, True, False, True): "recv_reduce_send",
    (True, True, True, True): "recv_reduce_copy_send",
    (True, False, True, True): "recv_copy_send",
    (True, False, False, True): "recv_send",
    (False, True, False, True): "send",
    (False, True, True, True): "copy_send",
    (False, True, True, False): "copy",
}


class AlgorithmError(ValueError):
    """An Algorithm (or its file) that is malformed: the message says where and what."""


@dataclass(frozen=True)
class Span:
    buffer: str  # input, output or scratch
    offset: int  # elements
    count: int

    def __str__(self) -> str:
        return f"{self.buffer}[{self.offset}:{self.offset + self.count}]"


@dataclass
class Step:
    kind: str = "fused"
    recv: int | None = None
    send: int | None = None
    local: Span | None = None
    dst: Span | None = None
    operand: Span | None = None
    count: int = 0
    finalize: bool = False  # divide by the world size (avg's last reduction)
    wait_sends: bool = False  # wait until earlier sends by reference were read
    copy_sends: bool = False  # send copies of local, never local by reference
    deps: list[tuple[int, int]] = field(default_factory=list)

    @property
    def name(self) -> str:
        """The step in MSCCL's words: send, recv, copy, recv_reduce_send, ..."""
        if self.kind != "fused":
            return self.kind
        present = (
            self.recv is not None,
            self.local is not None,
            self.dst is not None,
            self.send is not None,
        )
        return FUSED_NAMES.get(present, "nop")

    def spans(self) -> list[tuple[str, Span]]:
        return [
            (n, s)
            for n, s in (("local", self.local), ("dst", self.dst), ("operand", self.operand))
            if s is not None
        ]


@dataclass
class Channel:
    steps: list[Step] = field(default_factory=list)
    # Which connection the channel's messages use: a send on rank a's channel with tag t reaches
    # the channel with tag t on the receiving rank (MSCCL's "chan"). None: the channel's index.
    tag: int | None = None


@dataclass
class RankProgram:
    channels: list[Channel] = field(default_factory=lambda: [Channel()])
    scratch: int = 0  # elements of scratch the steps use


@dataclass
class Algorithm:
    """A collective on ``ranks`` ranks, for calls of ``count`` elements (what the call passes:
    per rank for allreduce, per block for reduce_scatter, allgather, alltoall, gather,
    scatter)."""

    name: str
    collective: str
    ranks: int
    count: int
    programs: list[RankProgram]
    root: int = 0
    in_place: bool = False
    avg: bool = False  # the reduction is avg: finalize steps divide
    elem_size: int = 4
    # The buffering it was planned for: messages of slot_bytes at most, slots of them in flight
    # per connection (the world-wide slice and FIFO depth of the executor).
    slot_bytes: int = 256 << 10
    slots: int = 8

    def buffer_counts(self, rank: int) -> dict[str, int]:
        """Elements of each buffer on ``rank`` (in place, input and output share memory)."""
        inputs, outputs = COLLECTIVES[self.collective](self.count, self.ranks, rank, self.root)
        return {"input": inputs, "output": outputs, "scratch": self.programs[rank].scratch}

    def in_place_offset(self, rank: int) -> int | None:
        """Where the input lies in the output (reduce_scatter: the output in the input), in
        elements, when the algorithm is in place; None otherwise."""
        if not self.in_place or self.collective not in IN_PLACE_OFFSET:
            return None
        return IN_PLACE_OFFSET[self.collective](self.count, rank)

    def steps(self):
        """(rank, channel, index, step) for every step."""
        for r, program in enumerate(self.programs):
            for c, channel in enumerate(program.channels):
                for i, step in enumerate(channel.steps):
                    yield r, c, i, step

    def issue_order(self, r: int) -> list[tuple[int, int]]:
        """Rank r's steps as (channel, index), each after the steps it depends on: the channels
        taken in turn, a step waiting until its deps are placed."""
        channels = self.programs[r].channels
        placed: set[tuple[int, int]] = set()
        nxt = [0] * len(channels)
        order = []
        while len(order) < sum(len(ch.steps) for ch in channels):
            progressed = False
            for c, ch in enumerate(channels):
                while nxt[c] < len(ch.steps):
                    deps = ch.steps[nxt[c]].deps
                    for d in deps:
                        dc, di = d
                        if not (0 <= dc < len(channels) and 0 <= di < len(channels[dc].steps)):
                            raise AlgorithmError(
                                f"{self.name}: rank {r} channel {c} step {nxt[c]} depends on "
                                f"channel {dc} step {di}, which does not exist"
                            )
                    if not all(tuple(d) in placed for d in deps):
                        break
                    placed.add((c, nxt[c]))
                    order.append((c, nxt[c]))
                    nxt[c] += 1
                    progressed = True
            if not progressed:
                stuck = [
                    (c, nxt[c]) for c in range(len(channels)) if nxt[c] < len(channels[c].steps)
                ]
                raise AlgorithmError(
                    f"{self.name}: rank {r}: steps wait for each other in a cycle "
                    f"(channel, step): {stuck}"
                )
        return order

    # ---- JSON ----------------------------------------------------------------------------

    def to_json(self) -> dict:
        def span(s):
            return None if s is None else [s.buffer, s.offset, s.count]

        def step(s: Step) -> dict:
            out = {"kind": s.kind, "count": s.count}
            for key in ("recv", "send"):
                if getattr(s, key) is not None:
                    out[key] = getattr(s, key)
            for key, value in s.spans():
                out[key] = span(value)
            for key in ("finalize", "wait_sends", "copy_sends"):
                if getattr(s, key):
                    out[key] = True
            if s.deps:
                out["deps"] = [list(d) for d in s.deps]
            return out

        return {
            "format": FORMAT,
            "name": self.name,
            "collective": self.collective,
            "ranks": self.ranks,
            "count": self.count,
            "root": self.root,
            "in_place": self.in_place,
            "avg": self.avg,
            "elem_size": self.elem_size,
            "slot_bytes": self.slot_bytes,
            "slots": self.slots,
            "programs": [
                {
                    "rank": r,
                    "scratch": p.scratch,
                    "channels": [
                        {"steps": [step(s) for s in ch.steps]}
                        | ({} if ch.tag is None else {"tag": ch.tag})
                        for ch in p.channels
                    ],
                }
                for r, p in enumerate(self.programs)
            ],
        }

    def save(self, path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n")

    @staticmethod
    def from_json(data: dict, source: str = "algorithm") -> Algorithm:
        return _parse(data, source)


def load(path) -> Algorithm:
    """Reads an Algorithm that ``Algorithm.save`` wrote; every field is checked first."""
    try:
        data = json.loads(Path(path).read_text())
    except json.JSONDecodeError as e:
        raise AlgorithmError(f"{path}: not JSON: {e}") from None
    return _parse(data, str(path))


# The checker models every element: a file may not ask for more than this per buffer (keep the
# Algorithm small and let topo.run scale it to large buffers).
LARGEST_COUNT = 1 << 22
TOP_KEYS = {
    "format",
    "name",
    "collective",
    "ranks",
    "count",
    "root",
    "in_place",
    "avg",
    "elem_size",
    "slot_bytes",
    "slots",
    "programs",
}
STEP_KEYS = {
    "kind",
    "recv",
    "send",
    "local",
    "dst",
    "operand",
    "count",
    "finalize",
    "wait_sends",
    "copy_sends",
    "deps",
}


def _parse(data, source: str) -> Algorithm:
    def fail(where: str, what: str):
        raise AlgorithmError(f"{source}: {where}: {what}")

    def known(obj, keys, where):
        if isinstance(obj, dict) and set(obj) - keys:
            fail(where, f"unknown key(s) {', '.join(sorted(set(obj) - keys))}")

    def need(obj, key, kind, where, default=None, optional=False):
        if not isinstance(obj, dict):
            fail(where, f"expected an object, got {type(obj).__name__}")
        if key not in obj:
            if optional:
                return default
            fail(where, f"missing '{key}'")
        value = obj[key]
        if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
            fail(where, f"'{key}' must be an integer, got {value!r}")
        if kind is not int and not isinstance(value, kind):
            fail(where, f"'{key}' must be {kind.__name__}, got {value!r}")
        return value

    known(data, TOP_KEYS, "top level")
    if need(data, "format", str, "top level") != FORMAT:
        fail("top level", f"format {data['format']!r} is not {FORMAT!r}")
    collective = need(data, "collective", str, "top level")
    if collective not in COLLECTIVES:
        fail("top level", f"collective {collective!r}: use one of {', '.join(COLLECTIVES)}")
    ranks = need(data, "ranks", int, "top level")
    count = need(data, "count", int, "top level")
    if not 1 <= ranks <= 4096 or not 0 <= count <= LARGEST_COUNT:
        fail(
            "top level",
            f"ranks ({ranks}) must be 1 to 4096 and count ({count}) 0 to {LARGEST_COUNT}",
        )
    programs_data = need(data, "programs", list, "top level")
    if len(programs_data) != ranks:
        fail("programs", f"{len(programs_data)} programs for {ranks} ranks")

    def peer(obj, key, where):
        value = need(obj, key, int, where, optional=True)
        if value is not None and not 0 <= value < ranks:
            fail(where, f"{key} peer {value} is not a rank of {ranks}")
        return value

    def span(obj, key, where):
        value = obj.get(key)
        if value is None:
            return None
        if (
            not isinstance(value, list)
            or len(value) != 3
            or value[0] not in BUFFERS
            or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value[1:])
        ):
            fail(
                where,
                f"{key} must be [buffer, offset, count] with a buffer of "
                f"{', '.join(BUFFERS)} and offsets not negative, got {value!r}",
            )
        return Span(*value)

    programs = []
    for r, p in enumerate(programs_data):
        where = f"rank {r}"
        if need(p, "rank", int, where) != r:
            fail(where, f"programs must be in rank order, found rank {p['rank']}")
        known(p, {"rank", "scratch", "channels"}, where)
        scratch = need(p, "scratch", int, where, default=0, optional=True)
        if not 0 <= scratch <= LARGEST_COUNT * ranks:
            fail(where, f"scratch {scratch} is negative or beyond what the checker models")
        channels = []
        for c, channel_data in enumerate(need(p, "channels", list, where)):
            known(channel_data, {"steps", "tag"}, f"{where} channel {c}")
            steps_data = need(channel_data, "steps", list, f"{where} channel {c}")
            tag = need(channel_data, "tag", int, f"{where} channel {c}", optional=True)
            steps = []
            for i, s in enumerate(steps_data):
                at = f"{where} channel {c} step {i}"
                known(s, STEP_KEYS, at)
                kind = need(s, "kind", str, at)
                if kind not in KINDS:
                    fail(at, f"kind {kind!r}: use one of {', '.join(KINDS)}")
                deps = need(s, "deps", list, at, default=[], optional=True)
                if not all(
                    isinstance(d, list)
                    and len(d) == 2
                    and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in d)
                    for d in deps
                ):
                    fail(at, f"deps must be [channel, step] pairs, got {deps!r}")
                steps.append(
                    Step(
                        kind=kind,
                        recv=peer(s, "recv", at),
                        send=peer(s, "send", at),
                        local=span(s, "local", at),
                        dst=span(s, "dst", at),
                        operand=span(s, "operand", at),
                        count=need(s, "count", int, at),
                        finalize=bool(need(s, "finalize", bool, at, False, optional=True)),
                        wait_sends=bool(need(s, "wait_sends", bool, at, False, optional=True)),
                        copy_sends=bool(need(s, "copy_sends", bool, at, False, optional=True)),
                        deps=[tuple(d) for d in deps],
                    )
                )
            channels.append(Channel(steps, tag))
        if not channels:
            fail(where, "needs at least one channel")
        programs.append(RankProgram(channels, scratch))
    algo = Algorithm(
        name=need(data, "name", str, "top level"),
        collective=collective,
        ranks=ranks,
        count=count,
        programs=programs,
        root=need(data, "root", int, "top level", 0, optional=True),
        in_place=bool(need(data, "in_place", bool, "top level", False, optional=True)),
        avg=bool(need(data, "avg", bool, "top level", False, optional=True)),
        elem_size=need(data, "elem_size", int, "top level", 4, optional=True),
        slot_bytes=need(data, "slot_bytes", int, "top level", 256 << 10, optional=True),
        slots=need(data, "slots", int, "top level", 8, optional=True),
    )
    if not 0 <= algo.root < ranks:
        fail("top level", f"root {algo.root} is not a rank of {ranks}")
    if algo.elem_size < 1 or algo.slot_bytes < algo.elem_size or algo.slots < 1:
        fail(
            "top level",
            "elem_size must be positive, slot_bytes at least one element and slots at least 1",
        )
    for r, c, i, step in algo.steps():
        if not 0 <= step.count <= LARGEST_COUNT * ranks:
            fail(f"rank {r} channel {c} step {i}", f"count {step.count} is out of range")
    return algo
