"""Checks an Algorithm by running every rank's steps symbolically, as the CPU executor would.

Each element holds the set of (rank, element) inputs reduced into it, so a result that misses a
contribution, holds one twice, holds the wrong rank's data or lands in the wrong place is caught
at the element where it happens. Messages travel through connections that hold ``slots``
messages of at most ``slot_bytes`` each, per (sender, receiver, channel), in order; a step
streams its elements slice by slice, reserving room to send before it waits to receive (the
executor's order). When no rank can move, the ranks that wait on each other are reported as a
deadlock. With ``slots=0`` sends are rendezvous, as NCCL's p2p sends are: a connection holds one
message, and its sender waits until the receiver has taken it before it goes on (so ranks that
send to each other before they receive deadlock, unless the sends are an exchange's). Sends the
executor may make by reference (plain sends, exchanges, and tcp's forwards of what a step wrote)
keep pointing at the sender's memory until read: a step that overwrites
such memory without ``wait_sends`` is an error.

What it does not model: timing (weft.topo.cost predicts that).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from weft.topo.algorithm import COLLECTIVES, IN_PLACE_OFFSET, KINDS, Algorithm, Span, Step

# Collectives whose output is a reduction (and so divided once where avg is asked for).
REDUCING = ("allreduce", "reduce_scatter", "reduce")


@dataclass
class Problem:
    """One thing wrong, and where: rank, channel and step (None where it is the whole
    algorithm's)."""

    text: str
    rank: int | None = None
    channel: int | None = None
    step: int | None = None
    step_name: str | None = None

    def __str__(self) -> str:
        if self.rank is None:
            return self.text
        where = f"rank {self.rank}"
        if self.step is not None:
            where += f" channel {self.channel} step {self.step} ({self.step_name})"
        return f"{where}: {self.text}"


@dataclass
class Report:
    algorithm: str
    ranks: int
    errors: list[Problem] = field(default_factory=list)
    messages: int = 0  # messages the ranks sent

    @property
    def ok(self) -> bool:
        return not self.errors

    def __str__(self) -> str:
        if self.ok:
            return f"{self.algorithm} on {self.ranks} ranks: ok ({self.messages} messages)"
        lines = [f"{self.algorithm} on {self.ranks} ranks: {len(self.errors)} error(s)"]
        return "\n".join(lines + [f"  {e}" for e in self.errors])


def _overlap(a: Span, b: Span) -> bool:
    return a.buffer == b.buffer and a.offset < b.offset + b.count and b.offset < a.offset + a.count


def shape_problems(algo: Algorithm) -> list[Problem]:
    """What must hold before any step can be looked at: the world, the collective, one program
    per rank, the root, the in-place layout."""
    problems = []
    if algo.collective not in COLLECTIVES:
        problems.append(
            Problem(f"collective {algo.collective!r}: use one of {', '.join(COLLECTIVES)}")
        )
    if algo.ranks < 1 or len(algo.programs) != algo.ranks:
        problems.append(Problem(f"{len(algo.programs)} programs for {algo.ranks} ranks"))
    if not 0 <= algo.root < max(algo.ranks, 1) or algo.count < 0:
        problems.append(
            Problem(
                f"root {algo.root} and count {algo.count}: the root must be a "
                "rank and the count not negative"
            )
        )
    if algo.in_place and algo.collective not in IN_PLACE_OFFSET:
        problems.append(
            Problem(
                f"{algo.collective} has no in-place form (those are {', '.join(IN_PLACE_OFFSET)})"
            )
        )
    for r, program in enumerate(algo.programs):
        if not program.channels or program.scratch < 0:
            problems.append(Problem("needs a channel and a scratch size not negative", r))
        problems += _shared_connections(program, r)
    return problems


def _shared_connections(program, r: int) -> list[Problem]:
    """Two channels of one rank that send to (or receive from) one peer on one tag: their
    messages would interleave in whatever order the channels happen to run."""
    user, problems = {}, []
    for c, channel in enumerate(program.channels):
        tag = c if channel.tag is None else channel.tag
        for i, s in enumerate(channel.steps):
            for peer, way in ((s.send, "send to"), (s.recv, "receive from")):
                if peer is None:
                    continue
                first = user.setdefault((tag, peer, way), c)
                if first not in (c, None):
                    problems.append(
                        Problem(
                            f"channels {first} and {c} both {way} rank {peer} on tag {tag}, so "
                            "their messages would interleave: give one a tag of its own",
                            r,
                            c,
                            i,
                        )
                    )
                    user[(tag, peer, way)] = None  # said once
    return problems


def route_problems(algo: Algorithm, topology, max_errors: int) -> list[Problem]:
    """Every step that sends to or receives from a rank the topology joins to it by no route
    (where its ranks do not forward, by no route free of other ranks' nodes)."""
    if topology.size != algo.ranks:
        return [Problem(f"the topology has {topology.size} ranks, the algorithm {algo.ranks}")]
    faults: dict[tuple[int, int], str | None] = {}
    problems = []
    for r, c, i, step in algo.steps():
        for peer, towards in ((step.send, True), (step.recv, False)):
            if peer is None or peer == r:
                continue
            pair = (r, peer) if towards else (peer, r)
            if pair not in faults:
                faults[pair] = topology.route_fault(*pair)
            if faults[pair] is not None and len(problems) < max_errors:
                what = f"sends to rank {peer}" if towards else f"receives from rank {peer}"
                problems.append(
                    Problem(
                        f"{what}, but the topology ({topology.name}) {faults[pair]}",
                        r,
                        c,
                        i,
                        step.name,
                    )
                )
    return problems


class _Stop(Exception):
    """Ends the symbolic run at the first error that leaves the state meaningless."""


@dataclass
class _Message:
    values: list
    length: int  # elements on the wire (scale times those of the Algorithm, or parts of them)
    sender_channel: int
    sender_step: int
    refs: list | None  # the sender's memory locations, for a send by reference
    clock: list  # the sender's vector clock when it sent
    read_at: tuple[int, int] | None = None  # (receiver, its clock) once read


@dataclass
class _Connection:
    queue: deque = field(default_factory=deque)
    reserved: int = 0


@dataclass
class _Wait:
    ready: object  # () -> bool
    what: str
    peers: tuple[int, ...]
    # The (rank, channel) pairs it waits on, where they are not the peers' channels of the
    # waiting channel's tag (a dependency on a channel of its own, readers of sends by reference).
    channels: tuple[tuple[int, int], ...] = ()


def check(
    algo: Algorithm,
    *,
    slots: int | None = None,
    slot_bytes: int | None = None,
    scale: int = 1,
    max_errors: int = 20,
    topology=None,
    direct_only: bool = False,
) -> Report:
    """Runs ``algo`` symbolically and returns a Report; ``report.ok`` when every rank ends with
    exactly the collective's result and nothing deadlocks with ``slots`` messages of
    ``slot_bytes`` per connection (default: what the algorithm was planned for; 0 slots:
    rendezvous sends, each waiting for its receiver). With
    ``scale``, each element stands for that many on the wire (how topo.run runs an Algorithm
    on larger buffers): messages are counted as the executor would cut them. With a
    ``topology`` (a weft.topo.Topology of as many ranks), every message between two ranks it has
    no route for is an error too: where the topology's ranks do not forward
    (``ranks_forward=False``, as GPUs joined by direct links do not: switches and NICs still
    may), every message joined only through another rank's node. ``direct_only=True`` checks
    as if this topology's ranks did not forward, whatever it says."""
    problems = shape_problems(algo)
    if not problems and topology is not None:
        if direct_only:
            topology = topology.with_ranks_forward(False)
        problems = route_problems(algo, topology, max_errors)
    if not problems and scale < 1:
        problems = [Problem(f"scale {scale} must be at least 1")]
    labels = 0 if problems else _modelled_elements(algo)
    if labels > MODELLED_ELEMENTS:
        problems = [
            Problem(
                f"the checker labels every element of every rank's buffers, "
                f"{labels} here, and takes at most {MODELLED_ELEMENTS}: write "
                "the Algorithm with a small count, a chunk per element, and let topo.run scale it "
                "to the buffer (check's scale= counts messages as the executor then cuts them)"
            )
        ]
    if problems:
        return Report(algo.name, algo.ranks, problems)
    run = _Run(
        algo,
        algo.slots if slots is None else slots,
        algo.slot_bytes if slot_bytes is None else slot_bytes,
        scale,
        max_errors,
    )
    run.static_checks()
    if run.report.ok:
        try:
            run.execute()
            run.check_results()
        except _Stop:
            pass
    return run.report


# Elements the symbolic execution labels, at most: 2^21 take it about 1 GB and 10 s.
MODELLED_ELEMENTS = 1 << 21


def _longest_buffer(algo: Algorithm) -> int:
    return max([1] + [n for r in range(algo.ranks) for n in algo.buffer_counts(r).values()])


def _modelled_elements(algo: Algorithm) -> int:
    """Labels: every element of every rank's input and output, at the longest buffer's count."""
    return 2 * algo.ranks * _longest_buffer(algo)


class _Run:
    def __init__(self, algo: Algorithm, slots: int, slot_bytes: int, scale: int, max_errors: int):
        if slots < 0 or slot_bytes < algo.elem_size:
            raise ValueError(
                f"slots ({slots}) must be at least 0 (0: rendezvous sends) and slot_bytes "
                f"({slot_bytes}) at least one element ({algo.elem_size} bytes)"
            )
        self.algo = algo
        self.rendezvous = slots == 0  # one message per connection, taken before the send ends
        self.slots = max(slots, 1)
        self.slice = slot_bytes // algo.elem_size  # elements on the wire per message
        self.scale = scale
        self.max_errors = max_errors
        self.report = Report(algo.name, algo.ranks)
        self.sizes = [algo.buffer_counts(r) for r in range(algo.ranks)]
        self.longest = _longest_buffer(algo)
        self.connections: dict[tuple[int, int, int], _Connection] = {}
        self.memory = [self._initial_memory(r) for r in range(algo.ranks)]
        # Happens-before: a vector clock per channel of every rank ("thread"), advanced by every
        # step, send and receive, merged by receives, dependencies and wait_sends. A send by
        # reference is safe to overwrite once its reading happened before; two channels of a
        # rank that touch the same element, one of them writing, must be ordered.
        self.threads = [(r, c) for r, p in enumerate(algo.programs) for c in range(len(p.channels))]
        self.thread = {rc: t for t, rc in enumerate(self.threads)}
        self.clock = [[0] * len(self.threads) for _ in self.threads]
        self.step_clock: dict[tuple[int, int, int], list] = {}  # (r, c, i) -> clock when done
        self.races = len(self.threads) > algo.ranks  # some rank has several channels
        self.last_write: dict = {}  # (rank, location) -> (thread, its clock then)
        self.reads_since: dict = {}  # (rank, location) -> {thread: its clock then}
        self.by_reference: list[dict] = [{} for _ in range(algo.ranks)]  # location -> messages
        self.since_wait: list[list] = [[] for _ in range(algo.ranks)]  # by reference, since
        self.done = [[0] * len(p.channels) for p in algo.programs]  # steps finished

    # ---- problems ------------------------------------------------------------------------

    def error(self, text, rank=None, channel=None, step=None, fatal=False):
        name = None
        if step is not None:
            name = self.algo.programs[rank].channels[channel].steps[step].name
        self.report.errors.append(Problem(text, rank, channel, step, name))
        if fatal or len(self.report.errors) >= self.max_errors:
            raise _Stop

    # ---- labels: a value is the set of original elements summed into it -------------------
    # (Sets, not bits of one integer: a mask's size grows with the element's number, which made
    # the memory quadratic in the buffers' length.)

    def label(self, buffer: str, rank: int, index: int) -> frozenset:
        base = 0 if buffer == "input" else self.algo.ranks * self.longest
        return frozenset((base + rank * self.longest + index,))

    def describe(self, mask: frozenset, limit: int = 3) -> str:
        names = []
        for element in sorted(mask)[:limit]:
            which, rest = divmod(element, self.algo.ranks * self.longest)
            rank, index = divmod(rest, self.longest)
            kind = "input" if which == 0 else "initial output"
            names.append(f"rank {rank}'s {kind}[{index}]")
        return ", ".join(names) + (", ..." if len(mask) > limit else "")

    # ---- memory: in place, input and output are one storage --------------------------------

    def _initial_memory(self, r: int) -> dict[str, list]:
        sizes, offset = self.sizes[r], self.algo.in_place_offset(r)
        memory = {
            "output": [(self.label("output", r, i), 0) for i in range(sizes["output"])],
            "input": [(self.label("input", r, i), 0) for i in range(sizes["input"])],
            "scratch": [None] * sizes["scratch"],
        }
        if offset is None:
            return memory
        if self.algo.collective == "reduce_scatter":
            return memory  # the output lies inside the input, which holds the data
        if offset + sizes["input"] > sizes["output"]:
            return memory  # no room for the in-place layout: the bounds check reports it
        memory["output"][offset : offset + sizes["input"]] = memory["input"]
        return memory

    def location(self, r: int, buffer: str, index: int) -> tuple[str, int]:
        offset = self.algo.in_place_offset(r)
        inner = "output" if self.algo.collective == "reduce_scatter" else "input"
        if offset is not None and buffer == inner:
            return ("input" if inner == "output" else "output", offset + index)
        return (buffer, index)

    def read(self, r: int, span: Span, start: int, n: int, at) -> list:
        values = []
        for i in range(span.offset + start, span.offset + start + n):
            store, index = self.location(r, span.buffer, i)
            if self.races:
                self.check_race(r, (store, index), f"reads {span.buffer}[{i}]", False, at)
            value = self.memory[r][store][index]
            if value is None:
                self.error(f"reads {span.buffer}[{i}] before any step wrote it", *at, fatal=True)
            values.append(value)
        return values

    def write(self, r: int, span: Span, start: int, values: list, at) -> None:
        for k, value in enumerate(values):
            i = span.offset + start + k
            where = self.location(r, span.buffer, i)
            for message in self.by_reference[r].pop(where, ()):
                self.check_read_before(r, span.buffer, i, message, at)
            if self.races:
                self.check_race(r, where, f"writes {span.buffer}[{i}]", True, at)
            self.memory[r][where[0]][where[1]] = value

    def check_race(self, r: int, where, what: str, writes: bool, at) -> None:
        """Two channels of rank r touch one element, at least one writing, with nothing that
        orders them (a dependency, or messages that make one follow the other)."""
        t = self.thread[(r, at[1])]
        clock, key = self.clock[t], (r, where)
        earlier = [self.last_write.get(key)]
        if writes:
            earlier += list(self.reads_since.get(key, {}).items())
        for other in earlier:
            if other is not None and other[0] != t and clock[other[0]] < other[1]:
                self.error(
                    f"{what}, which channel {self.threads[other[0]][1]} also touches with "
                    "nothing ordering the two (add a dependency)",
                    *at,
                    fatal=True,
                )
        if writes:
            self.last_write[key] = (t, clock[t])
            self.reads_since[key] = {}
        else:
            self.reads_since.setdefault(key, {})[t] = clock[t]

    def check_read_before(self, r: int, buffer: str, i: int, message: _Message, at) -> None:
        """A step may overwrite memory an earlier send referenced only once that send's reading
        happened before it: heard of by a receive, or waited for with wait_sends."""
        fix = "(the step needs wait_sends, or the send copy_sends)"
        if message.read_at is None:
            self.error(
                f"overwrites {buffer}[{i}] while a send by reference of it is unread {fix}",
                *at,
                fatal=True,
            )
        reader, when = message.read_at
        if self.clock[self.thread[(r, at[1])]][reader] < when:
            self.error(
                f"overwrites {buffer}[{i}], which rank {self.threads[reader][0]} reads by "
                f"reference with nothing ordering that read first {fix}",
                *at,
                fatal=True,
            )

    def reduce(self, a: list, b: list, what: str, at) -> list:
        out = []
        for x, y in zip(a, b):
            if x[1] or y[1]:
                self.error(f"reduces {what} that was already divided (finalize)", *at, fatal=True)
            if x[0] & y[0]:
                self.error(
                    f"reduces {what} holding {self.describe(x[0] & y[0])} twice", *at, fatal=True
                )
            out.append((x[0] | y[0], 0))
        return out

    def divide(self, values: list, step: Step) -> list:
        if not (step.finalize and self.algo.avg):
            return values
        return [(mask, div + 1) for mask, div in values]

    # ---- static checks --------------------------------------------------------------------

    def static_checks(self) -> None:
        algo = self.algo
        for r, c, i, step in algo.steps():
            at = (r, c, i)
            try:
                self.check_step(r, c, i, step, at)
            except _Stop:
                return

    def check_step(self, r: int, c: int, i: int, s: Step, at) -> None:
        """The rules the core's algo::validate applies to every step before running it, and
        the dependencies, which only the checker sees."""
        sizes = self.sizes[r]
        if s.kind not in KINDS or s.count < 0:
            self.error(f"kind {s.kind!r} with count {s.count}: use one of {', '.join(KINDS)}", *at)
            return
        for key, span in s.spans():
            if span.offset < 0 or span.count < 0 or span.buffer not in sizes:
                self.error(f"{key} {span} is not a span of input, output or scratch", *at)
                return
            if span.offset + span.count > sizes[span.buffer]:
                self.error(
                    f"{key} {span} lies outside {span.buffer} ({sizes[span.buffer]} elements)", *at
                )
        if s.dst is not None and s.dst.buffer == "input" and s.dst.count:
            self.error("writes into the input (results go to output or scratch)", *at)
        for key in ("recv", "send"):
            peer = getattr(s, key)
            if peer is not None and not (0 <= peer < self.algo.ranks and peer != r):
                self.error(f"{key} peer {peer} is not another rank of {self.algo.ranks}", *at)
        for dep_channel, dep_step in s.deps:
            channels = self.algo.programs[r].channels
            if not (
                0 <= dep_channel < len(channels)
                and 0 <= dep_step < len(channels[dep_channel].steps)
            ):
                self.error(
                    f"depends on channel {dep_channel} step {dep_step}, which does not exist", *at
                )
            elif dep_channel == c and dep_step >= i:
                self.error(f"depends on step {dep_step} of its own channel, which runs later", *at)
        if s.kind == "fused":
            for key, span in s.spans():
                if key == "operand":
                    self.error("a fused step has no operand", *at)
                elif span.count != s.count:
                    self.error(f"{key} {span} has {span.count} elements, the step {s.count}", *at)
            if s.count and not (s.recv is not None or s.local is not None):
                self.error("has neither a peer to receive from nor local data", *at)
            if s.count and s.dst is None and s.send is None:
                self.error("neither writes nor sends its data", *at)
        elif s.kind == "exchange":
            if s.recv is None and s.send is None:
                self.error("an exchange with neither peer", *at)
            if (s.send is None and s.local is not None and s.local.count) or (
                s.recv is None and s.dst is not None and s.dst.count
            ):
                self.error(
                    "an exchange's local needs a peer to send to, and its dst one to receive from",
                    *at,
                )
            if s.operand is not None and (
                s.dst is None or s.operand.count != s.dst.count or s.recv is None
            ):
                self.error("an operand needs a dst of its length and a peer to receive from", *at)
            if s.finalize and s.operand is None:
                self.error("an exchange divides (finalize) only with an operand", *at)
            if s.local is not None and s.dst is not None and _overlap(s.local, s.dst):
                self.error("an exchange's dst may not overlap what it sends", *at)
        elif s.kind == "reduce":
            if (
                s.recv is not None
                or s.send is not None
                or s.operand is not None
                or s.local is None
                or s.dst is None
                or s.local.count != s.count
                or (s.dst.count != s.count)
            ):
                self.error("a reduce needs no peers, and a local and a dst of count elements", *at)
            elif _overlap(s.local, s.dst) and s.local != s.dst:
                self.error("a reduce's dst overlaps its local without being it", *at)
        elif (
            s.local is None
            or s.dst is None
            or s.count == 0
            or s.dst.count != s.count
            or (s.local.count % s.count or s.local.count // s.count < 2)
        ):
            self.error(
                "local_reduce needs local of two or more blocks of count elements and a "
                "dst of count",
                *at,
            )
        else:
            first_two = (
                Span(s.local.buffer, s.local.offset + k * s.count, s.count) for k in (0, 1)
            )
            if _overlap(s.dst, s.local) and s.dst not in first_two:
                self.error("a local_reduce's dst overlaps a block it has yet to read", *at)

    # ---- the run --------------------------------------------------------------------------

    def connection(self, sender: int, receiver: int, tag: int) -> _Connection:
        return self.connections.setdefault((sender, receiver, tag), _Connection())

    def tag(self, r: int, c: int) -> int:
        tag = self.algo.programs[r].channels[c].tag
        return c if tag is None else tag

    def execute(self) -> None:
        runners = {}
        for r, program in enumerate(self.algo.programs):
            for c in range(len(program.channels)):
                runners[(r, c)] = [self.channel_steps(r, c), None]
        while runners:
            moved = False
            for key in list(runners):
                entry = runners[key]
                while entry[1] is None or entry[1].ready():
                    try:
                        entry[1] = next(entry[0])
                    except StopIteration:
                        del runners[key]
                        moved = True
                        break
                    moved = True
            if not moved:
                self.report_deadlock(runners)
                raise _Stop

    def channel_steps(self, r: int, c: int):
        steps = self.algo.programs[r].channels[c].steps
        clock = self.clock[self.thread[(r, c)]]
        for i, s in enumerate(steps):
            at = (r, c, i)
            for dc, di in s.deps:
                yield _Wait(
                    lambda dc=dc, di=di: self.done[r][dc] > di,
                    f"waits for its channel {dc} to finish step {di}",
                    (r,),
                    ((r, dc),),
                )
                if self.races:  # a step of its own channel is ordered already
                    clock[:] = [max(a, b) for a, b in zip(clock, self.step_clock[(r, dc, di)])]
            clock[self.thread[(r, c)]] += 1
            if s.wait_sends:
                unread = [(q, m) for q, m in self.since_wait[r] if m.read_at is None]
                yield _Wait(
                    lambda: all(m.read_at for _, m in self.since_wait[r]),
                    "waits until its sends by reference are read",
                    tuple(sorted({q for q, _ in unread})),
                    tuple(
                        sorted(
                            {
                                node
                                for q, m in unread
                                for node in self.channels_of(q, self.tag(r, m.sender_channel))
                            }
                        )
                    ),
                )
                for _, message in self.since_wait[r]:  # the transport said so: happens-before
                    reader, when = message.read_at
                    clock[reader] = max(clock[reader], when)
                self.since_wait[r].clear()
            if s.kind == "fused":
                yield from self.fused(r, c, i, s, at)
            elif s.kind == "exchange":
                yield from self.exchange(r, c, i, s, at)
            elif s.kind == "reduce":
                into = self.read(r, s.dst, 0, s.count, at)
                local = self.read(r, s.local, 0, s.count, at)
                values = self.reduce(into, local, f"{s.local} into {s.dst}", at)
                self.write(r, s.dst, 0, self.divide(values, s), at)
            else:
                self.local_reduce(r, s, at)
            if self.races:
                self.step_clock[at] = clock[:]
            self.done[r][c] = i + 1

    def channels_of(self, q: int, tag: int) -> list[tuple[int, int]]:
        """(q, channel) for each channel of rank q that uses connections of ``tag``."""
        return [(q, c) for c in range(len(self.algo.programs[q].channels)) if self.tag(q, c) == tag]

    def post(self, r, c, i, peer, values: list, length: int, refs: list | None) -> _Message:
        t = self.thread[(r, c)]
        self.clock[t][t] += 1
        message = _Message(values, length, c, i, refs, self.clock[t][:])
        self.clock[t][t] += 1  # what the channel does next comes after the send
        if refs:
            for where in refs:
                self.by_reference[r].setdefault(where, []).append(message)
            self.since_wait[r].append((peer, message))
        self.connection(r, peer, self.tag(r, c)).queue.append(message)
        self.report.messages += 1
        return message

    def taken(self, message: _Message | None, peer: int) -> _Wait | None:
        """Where sends are rendezvous, the wait for ``peer`` to take ``message``."""
        if not self.rendezvous or message is None or message.read_at is not None:
            return None
        return _Wait(
            lambda: message.read_at is not None,
            f"waits for rank {peer} to receive its send (rendezvous)",
            (peer,),
        )

    def take(self, sender: int, r: int, c: int, length: int, at) -> list:
        message = self.connection(sender, r, self.tag(r, c)).queue.popleft()
        t = self.thread[(r, c)]
        clock = self.clock[t]
        clock[:] = [max(a, b) for a, b in zip(clock, message.clock)]
        clock[t] += 1
        message.read_at = (t, clock[t])
        if message.length != length:
            self.error(
                f"expects {length} elements from rank {sender}, whose step {message.sender_step} "
                f"sent {message.length}",
                *at,
                fatal=True,
            )
        return message.values

    def pieces(self, count: int) -> list[tuple[int, int, int]]:
        """(first element, elements, elements on the wire) of each message a stream of ``count``
        elements travels in: each element stands for ``scale`` on the wire, a message holds a
        slice of those, and an element goes with the message that carries its last part."""
        wire, out, done = count * self.scale, [], 0
        for first in range(0, wire, self.slice):
            end = min(wire, first + self.slice)
            out.append((done, end // self.scale - done, end - first))
            done = end // self.scale
        return out

    def room(self, conn: _Connection) -> bool:
        return len(conn.queue) + conn.reserved < self.slots

    def refs(self, r: int, span: Span, start: int, n: int) -> list:
        return [self.location(r, span.buffer, span.offset + start + k) for k in range(n)]

    def fused(self, r: int, c: int, i: int, s: Step, at):
        divides = s.finalize and self.algo.avg
        # What the executor may send by reference: local memory as it is (a plain send), or on
        # tcp what the step wrote to dst.
        plain_send = s.recv is None and s.dst is None and not divides and not s.copy_sends
        for start, n, length in self.pieces(s.count):
            out = None
            if s.send is not None:
                out = self.connection(r, s.send, self.tag(r, c))
                yield _Wait(
                    lambda out=out: self.room(out),
                    f"waits for room to send to rank {s.send} (its {self.slots} slot(s) are full)",
                    (s.send,),
                )
                out.reserved += 1
            incoming = None
            if s.recv is not None:
                conn = self.connection(s.recv, r, self.tag(r, c))
                yield _Wait(
                    lambda conn=conn: bool(conn.queue),
                    f"waits to receive from rank {s.recv}",
                    (s.recv,),
                )
                incoming = self.take(s.recv, r, c, length, at)
            local = self.read(r, s.local, start, n, at) if s.local is not None else None
            if incoming is not None and local is not None:
                data = self.reduce(incoming, local, f"{s.local} with rank {s.recv}'s data", at)
            else:
                data = incoming if incoming is not None else local
            data = self.divide(data, s)
            if s.dst is not None:
                self.write(r, s.dst, start, data, at)
            if out is not None:
                out.reserved -= 1
                refs = None
                if plain_send:
                    refs = self.refs(r, s.local, start, n)
                elif s.dst is not None:
                    refs = self.refs(r, s.dst, start, n)
                wait = self.taken(self.post(r, c, i, s.send, data, length, refs), s.send)
                if wait:
                    yield wait

    def exchange(self, r: int, c: int, i: int, s: Step, at):
        def pieces(span):  # an absent or empty side still moves one empty message
            return self.pieces(span.count if span is not None else 0) or [(0, 0, 0)]

        sends = deque(pieces(s.local)) if s.send is not None else deque()
        receives = deque(pieces(s.dst)) if s.recv is not None else deque()
        out = self.connection(r, s.send, self.tag(r, c)) if s.send is not None else None
        inc = self.connection(s.recv, r, self.tag(r, c)) if s.recv is not None else None
        last_sent = None  # both directions progress at once, so a rendezvous waits at the end
        while sends or receives:
            can_send = bool(sends) and self.room(out)
            can_receive = bool(receives) and bool(inc.queue)
            if not (can_send or can_receive):
                waits = ([f"to receive from rank {s.recv}"] if receives else []) + (
                    [f"for room to send to rank {s.send}"] if sends else []
                )
                peers = tuple(p for p, pending in ((s.recv, receives), (s.send, sends)) if pending)
                yield _Wait(
                    lambda: (sends and self.room(out)) or (receives and bool(inc.queue)),
                    "waits " + " and ".join(waits),
                    peers,
                )
                continue
            if can_send:
                start, n, length = sends.popleft()
                values = self.read(r, s.local, start, n, at) if n else []
                refs = self.refs(r, s.local, start, n) if n else None  # by reference
                last_sent = self.post(r, c, i, s.send, values, length, refs)
            if can_receive:
                start, n, length = receives.popleft()
                values = self.take(s.recv, r, c, length, at)
                if s.operand is not None and n:  # only the reduction divides
                    operand = self.read(r, s.operand, start, n, at)
                    values = self.reduce(
                        values, operand, f"{s.operand} with rank {s.recv}'s data", at
                    )
                    values = self.divide(values, s)
                if n:
                    self.write(r, s.dst, start, values, at)
        wait = self.taken(last_sent, s.send)
        if wait:
            yield wait

    def local_reduce(self, r: int, s: Step, at) -> None:
        blocks = s.local.count // s.count
        acc = self.read(r, s.local, 0, s.count, at)
        for b in range(1, blocks):
            acc = self.reduce(
                acc, self.read(r, s.local, b * s.count, s.count, at), f"block {b} of {s.local}", at
            )
        self.write(r, s.dst, 0, self.divide(acc, s), at)

    def report_deadlock(self, runners: dict) -> None:
        blocked = {node: wait for node, (_, wait) in sorted(runners.items())}

        def part(node) -> str:
            r, c = node
            return f"rank {r} channel {c} step {self.done[r][c]} {blocked[node].what}"

        cycle = self.find_cycle(blocked)
        if cycle:
            text = "deadlock: " + "; ".join(map(part, cycle))
            start = cycle[0]
        else:
            start = next(iter(blocked))
            ranks_blocked = {r for r, _ in blocked}
            finished = [q for q in blocked[start].peers if q not in ranks_blocked]
            text = (
                "waits forever: "
                + "; ".join(part(node) for node in blocked if node[0] == start[0])
                + (f" (rank {finished[0]} has finished its steps)" if finished else "")
            )
        self.error(text, start[0], start[1], self.done[start[0]][start[1]])

    def waits_on(self, node, wait: _Wait) -> list[tuple[int, int]]:
        """The (rank, channel) pairs a blocked channel waits on: its wait's own, or the channels
        of its peers that use its connections' tag."""
        if wait.channels:
            return list(wait.channels)
        tag = self.tag(*node)
        return [pair for q in wait.peers for pair in self.channels_of(q, tag)]

    def find_cycle(self, blocked: dict) -> list[tuple[int, int]]:
        """Channels (rank, channel) that wait on each other in a circle, across ranks and
        channels, following each blocked channel's first blocked one; empty where the waits end
        at a channel that has finished."""
        edges = {
            node: sorted(set(self.waits_on(node, wait)) & set(blocked))
            for node, wait in blocked.items()
        }
        for first in blocked:
            path, index, node = [], {}, first
            while node is not None and node not in index:
                index[node] = len(path)
                path.append(node)
                node = edges[node][0] if edges[node] else None
            if node is not None:
                return path[index[node] :]
        return []

    # ---- results --------------------------------------------------------------------------

    def check_results(self) -> None:
        for (sender, receiver, tag), conn in sorted(self.connections.items()):
            if conn.queue:
                first = conn.queue[0]
                self.error(
                    f"sent {len(conn.queue)} message(s) to rank {receiver} (channel tag {tag}) "
                    "that no step receives",
                    sender,
                    first.sender_channel,
                    first.sender_step,
                )
        for r in range(self.algo.ranks):
            expected = self.expected_output(r)
            if expected is None:
                continue
            reduced_here = self.algo.collective in REDUCING and (
                self.algo.collective != "reduce" or r == self.algo.root
            )
            divided = 1 if self.algo.avg and reduced_here else 0
            for i, want in enumerate(expected):
                store, index = self.location(r, "output", i)
                got, div = self.memory[r][store][index]
                if got != want:
                    self.error(self.difference(i, got, want), r)
                elif div != divided:
                    self.error(
                        f"output[{i}] divided {div} time(s) by the world size, not {divided}", r
                    )

    def difference(self, i: int, got: frozenset, want: frozenset) -> str:
        missing, extra = want - got, got - want
        parts = []
        if missing:
            parts.append(f"misses {self.describe(missing)}")
        if extra:
            parts.append(f"holds {self.describe(extra)}, which does not belong there")
        return f"output[{i}] " + " and ".join(parts)

    def expected_output(self, r: int) -> list[frozenset] | None:
        a, n, count, root = self.algo, self.algo.ranks, self.algo.count, self.algo.root
        ranks = range(n)

        def reduced(index):
            return frozenset().union(*(self.label("input", q, index) for q in ranks))

        if a.collective == "allreduce":
            return [reduced(i) for i in range(count)]
        if a.collective == "reduce_scatter":
            return [reduced(r * count + i) for i in range(count)]
        if a.collective == "allgather":
            return [self.label("input", q, i) for q in ranks for i in range(count)]
        if a.collective == "broadcast":
            return [self.label("output", root, i) for i in range(count)]
        if a.collective == "reduce":
            if r == root:
                return [reduced(i) for i in range(count)]
            return None if a.in_place else [self.label("output", r, i) for i in range(count)]
        if a.collective == "alltoall":
            return [self.label("input", q, r * count + i) for q in ranks for i in range(count)]
        if a.collective == "gather":
            if r != root:
                return None
            return [self.label("input", q, i) for q in ranks for i in range(count)]
        if a.collective == "scatter":
            return [self.label("input", root, r * count + i) for i in range(count)]
        return None  # barrier: nothing but that every rank gets through
