"""A small language for writing Algorithms by hand: a Program, and a method per kind of step.

>>> p = topo.Program("allreduce", ranks=2, count=4, name="swap")
>>> for r in (0, 1):
...     p.send(r, to=1 - r, src=p.input[0:4])
...     p.recv_reduce(r, frm=1 - r, src=p.input[0:4], dst=p.output[0:4])
>>> topo.check(p.algorithm()).ok
True

Spans are written ``p.input[a:b]``, ``p.output[a:b]``, ``p.scratch[a:b]`` (elements); each rank's
scratch grows to what its steps use. Every method takes ``channel=`` (default 0), ``after=``
(steps of the same rank, as returned by earlier calls, that must finish first) and the step
flags ``finalize``, ``wait_sends``, ``copy_sends``; it returns a reference to the step.
"""

from __future__ import annotations

from dataclasses import dataclass

from weft.topo.algorithm import Algorithm, AlgorithmError, Channel, RankProgram, Span, Step


@dataclass(frozen=True)
class StepRef:
    rank: int
    channel: int
    index: int


class _Buffer:
    def __init__(self, name: str):
        self.name = name

    def __getitem__(self, elements: slice) -> Span:
        if not isinstance(elements, slice) or elements.step not in (None, 1):
            raise AlgorithmError(f"{self.name}[a:b] takes a slice of consecutive elements")
        start, stop = elements.start or 0, elements.stop
        if stop is None or not 0 <= start <= stop:
            raise AlgorithmError(f"{self.name}[{start}:{stop}]: give 0 <= start <= stop")
        return Span(self.name, start, stop - start)


class Program:
    """Every rank's steps, written one call at a time; ``algorithm()`` gives the Algorithm."""

    def __init__(
        self,
        collective: str,
        ranks: int,
        count: int,
        *,
        name: str,
        root: int = 0,
        in_place: bool = False,
        avg: bool = False,
    ):
        self.collective, self.ranks, self.count, self.name = collective, ranks, count, name
        self.root, self.in_place, self.avg = root, in_place, avg
        self.input, self.output, self.scratch = (
            _Buffer("input"),
            _Buffer("output"),
            _Buffer("scratch"),
        )
        self._channels: list[dict[int, list[Step]]] = [{} for _ in range(ranks)]

    # ---- the steps --------------------------------------------------------------------------

    def send(self, rank, to, src, **options) -> StepRef:
        return self._add(rank, options, send=to, local=src)

    def recv(self, rank, frm, dst, **options) -> StepRef:
        return self._add(rank, options, recv=frm, dst=dst)

    def recv_reduce(self, rank, frm, src, dst, **options) -> StepRef:
        return self._add(rank, options, recv=frm, local=src, dst=dst)

    def recv_reduce_send(self, rank, frm, to, src, **options) -> StepRef:
        return self._add(rank, options, recv=frm, send=to, local=src)

    def recv_reduce_copy_send(self, rank, frm, to, src, dst, **options) -> StepRef:
        return self._add(rank, options, recv=frm, send=to, local=src, dst=dst)

    def recv_copy_send(self, rank, frm, to, dst, **options) -> StepRef:
        return self._add(rank, options, recv=frm, send=to, dst=dst)

    def copy(self, rank, src, dst, **options) -> StepRef:
        return self._add(rank, options, local=src, dst=dst)

    def local_reduce(self, rank, src, dst, **options) -> StepRef:
        """dst = the reduction of the blocks of ``src``, each as long as ``dst``."""
        return self._add(rank, options, kind="local_reduce", local=src, dst=dst, count=dst.count)

    def reduce(self, rank, src, dst, **options) -> StepRef:
        """dst = dst (op) src, locally."""
        return self._add(rank, options, kind="reduce", local=src, dst=dst)

    def exchange(self, rank, peer, send, recv, *, operand=None, **options) -> StepRef:
        """``send`` goes to ``peer`` while ``recv`` arrives from it (reduced with ``operand``)."""
        return self._add(
            rank,
            options,
            kind="exchange",
            send=peer,
            recv=peer,
            local=send,
            dst=recv,
            operand=operand,
            count=0,
        )

    # ---- the result -------------------------------------------------------------------------

    def algorithm(self) -> Algorithm:
        programs = []
        for channels in self._channels:
            ordered = [Channel(channels.get(c, [])) for c in range(max(channels, default=0) + 1)]
            used = [
                s.offset + s.count
                for ch in ordered
                for step in ch.steps
                for _, s in step.spans()
                if s.buffer == "scratch"
            ]
            programs.append(RankProgram(ordered, scratch=max(used, default=0)))
        return Algorithm(
            self.name,
            self.collective,
            self.ranks,
            self.count,
            programs,
            root=self.root,
            in_place=self.in_place,
            avg=self.avg,
        )

    def _add(self, rank: int, options: dict, kind: str = "fused", count=None, **fields) -> StepRef:
        channel = options.pop("channel", 0)
        after = options.pop("after", ())
        unknown = set(options) - {"finalize", "wait_sends", "copy_sends"}
        if unknown:
            raise AlgorithmError(f"unknown option(s) {', '.join(sorted(unknown))}")
        if not 0 <= rank < self.ranks or channel < 0:
            raise AlgorithmError(f"rank {rank} channel {channel}: not in a world of {self.ranks}")
        deps = []
        for ref in [after] if isinstance(after, StepRef) else list(after):
            if ref.rank != rank:
                raise AlgorithmError(f"rank {rank} cannot wait for a step of rank {ref.rank}")
            deps.append((ref.channel, ref.index))
        if count is None:
            spans = [s for s in (fields.get("local"), fields.get("dst")) if s is not None]
            count = spans[0].count if spans else 0
        steps = self._channels[rank].setdefault(channel, [])
        steps.append(Step(kind=kind, count=count, deps=deps, **fields, **options))
        return StepRef(rank, channel, len(steps) - 1)
