"""topo.run: an Algorithm on real ranks, through the same executor as weft's own collectives.

Every rank calls ``topo.run(algo, comm, buf, out)`` with its own buffers, like a collective. The
Algorithm is first checked for the communicator's connections (its slice and slots), so what
runs has been shown right and free of deadlocks there; then each rank's steps go to the executor
(``Communicator.run_plan``), which checks every peer and span against the rank's buffers again.
Buffers may be any whole multiple of the Algorithm's sizes: each element of the Algorithm then
stands for that many (an MSCCL chunk becomes a block of the buffer), and the checker counts the
messages the executor cuts those blocks into. The check runs at every call: for a loop of calls,
``prepare`` once and call ``comm.run_plan`` with what it returns.
"""

from __future__ import annotations

from dataclasses import astuple, replace

import numpy as np

from weft.topo.algorithm import Algorithm, AlgorithmError, Span
from weft.topo.check import check

RUNNABLE = ("fused", "exchange", "local_reduce", "reduce")


def scaled(algo: Algorithm, factor: int) -> Algorithm:
    """The same Algorithm with every element standing for ``factor`` elements."""
    if factor == 1:
        return algo

    def span(s: Span | None) -> Span | None:
        return None if s is None else Span(s.buffer, s.offset * factor, s.count * factor)

    programs = []
    for program in algo.programs:
        channels = [
            replace(
                ch,
                steps=[
                    replace(
                        s,
                        local=span(s.local),
                        dst=span(s.dst),
                        operand=span(s.operand),
                        count=s.count * factor,
                    )
                    for s in ch.steps
                ],
            )
            for ch in program.channels
        ]
        programs.append(replace(program, channels=channels, scratch=program.scratch * factor))
    return replace(algo, programs=programs, count=algo.count * factor)


def plan_of(algo: Algorithm, rank: int) -> dict:
    """Rank ``rank``'s steps in the form Communicator.run_plan takes: every channel's steps in
    one list, in an order where each step comes after the steps it depends on and after the
    earlier steps of its channel (the executor still runs the channels side by side); deps as
    indices into that list; the tags numbered 0, 1, ... in the order the whole Algorithm uses
    them by messages, so that a communicator needs only as many connection sets as there are
    such tags."""
    program = algo.programs[rank]
    tags = _tag_numbers(algo)
    order = algo.issue_order(rank)
    position = {key: n for n, key in enumerate(order)}  # (channel, index) -> place in the list
    steps = [_runnable(algo, rank, c, i, program.channels[c].steps[i], position) for c, i in order]
    channel_tags = [tags.get(_tag(ch, c), 0) for c, ch in enumerate(program.channels)]
    return {
        "algorithm": algo.name,
        "scratch": program.scratch,
        "steps": steps,
        "channel_tags": [] if channel_tags == [0] else channel_tags,
    }


def _tag(channel, index: int) -> int:
    return index if channel.tag is None else channel.tag


def _tag_numbers(algo: Algorithm) -> dict[int, int]:
    """A number for each tag that carries messages (a channel that only computes needs no
    connections: it gets 0)."""
    used = sorted(
        {
            _tag(ch, c)
            for p in algo.programs
            for c, ch in enumerate(p.channels)
            if any(s.send is not None or s.recv is not None for s in ch.steps)
        }
    )
    return {tag: n for n, tag in enumerate(used)}


def _runnable(algo: Algorithm, rank: int, c: int, i: int, s, position: dict) -> dict:
    if s.kind not in RUNNABLE:
        raise AlgorithmError(
            f"{algo.name}: rank {rank} channel {c} step {i} ({s.name}): the executor runs "
            f"{', '.join(RUNNABLE)} steps"
        )
    return {
        "kind": s.kind,
        "recv": s.recv,
        "send": s.send,
        "local": None,
        "dst": None,
        "operand": None,
        **{key: astuple(span) for key, span in s.spans()},
        "count": s.count,
        "finalize": s.finalize,
        "wait_sends": s.wait_sends,
        "copy_sends": s.copy_sends,
        "channel": c,
        "after": sorted(position[tuple(d)] for d in s.deps),
    }


def connection_geometry(comm) -> tuple[int, int]:
    """(slots, slot_bytes) of the communicator's connections: the world's slice, and as many
    of them as a step's budget (half the slots' bytes) implies."""
    topology = comm.topology
    return max(1, 2 * topology.step_bytes // topology.slice_bytes), topology.slice_bytes


def run(algo: Algorithm, comm, buf, out, *, op: str = "sum", async_: bool = False):
    """Runs ``algo`` on ``comm``'s ranks: ``buf`` is this rank's input, ``out`` its output (the
    same array, or views of one, where the Algorithm is in place). Returns ``out``, or a Handle
    with ``async_``. Raises AlgorithmError when the Algorithm does not fit the world or fails
    the checker for the communicator's connections."""
    plan = prepare(algo, comm, buf, out, op=op)
    return comm.run_plan(plan, buf, out, op=op, async_=async_)


def prepare(algo: Algorithm, comm, buf, out, *, op: str = "sum") -> dict:
    """What ``run`` checks and gives the executor, for calls on buffers like ``buf`` and
    ``out``: this rank's Plan (``comm.run_plan(plan, buf, out, op=op)`` runs it), once the
    Algorithm has passed the checker for the communicator's connections. A loop of calls
    prepares once."""
    if algo.ranks != comm.size:
        raise AlgorithmError(
            f"{algo.name} is for {algo.ranks} ranks; the communicator has {comm.size}"
        )
    if op == "avg" and not algo.avg:
        raise AlgorithmError(
            f"{algo.name} has no finalize steps: make it with avg=True to run op='avg'"
        )
    rank = comm.rank
    sizes = algo.buffer_counts(rank)
    inputs, outputs = np.asarray(buf), np.asarray(out)
    factor = _factor(algo, inputs.size, outputs.size, sizes)
    _check_layout(algo, rank, inputs, outputs, factor)
    if not algo.in_place and np.shares_memory(inputs, outputs):
        raise AlgorithmError(f"{algo.name} is not in place: give it input and output apart")
    slots, slot_bytes = connection_geometry(comm)
    # As the executor will run it: this element size, divisions only for avg, and each element
    # standing for `factor` (so messages are counted as the executor cuts the larger buffers).
    as_run = replace(algo, elem_size=inputs.dtype.itemsize, avg=op == "avg")
    report = check(as_run, slots=slots, slot_bytes=slot_bytes, scale=factor)
    if not report.ok:
        raise AlgorithmError(
            f"{algo.name} fails the checker for this communicator's "
            f"connections ({slots} slots of {slot_bytes} bytes):\n{report}"
        )
    return plan_of(scaled(as_run, factor), rank)


def _factor(algo: Algorithm, in_count: int, out_count: int, sizes: dict) -> int:
    """How many buffer elements each of the Algorithm's elements stands for: the same whole
    number for input and output (a buffer the Algorithm does not use must be empty)."""
    factors = set()
    for n, want in ((in_count, sizes["input"]), (out_count, sizes["output"])):
        if want == 0 and n != 0 or want and n % want:
            factors.add(0)
        elif want:
            factors.add(n // want)
    if len(factors) > 1 or 0 in factors:
        raise AlgorithmError(
            f"{algo.name}: buffers of {in_count} and {out_count} elements are not one whole "
            f"multiple of its {sizes['input']} and {sizes['output']}"
        )
    return factors.pop() if factors else 1


def _check_layout(algo: Algorithm, rank: int, inputs, outputs, factor: int) -> None:
    """In place, the input must lie where the Algorithm assumes it does in the output."""
    offset = algo.in_place_offset(rank)
    if offset is None:
        return
    inner, outer = (outputs, inputs) if algo.collective == "reduce_scatter" else (inputs, outputs)
    start = inner.__array_interface__["data"][0] - outer.__array_interface__["data"][0]
    if start != offset * factor * outer.dtype.itemsize:
        raise AlgorithmError(
            f"{algo.name} is in place: on rank {rank} the "
            f"{'output' if inner is outputs else 'input'} must be the view at element "
            f"{offset * factor} of the {'input' if inner is outputs else 'output'}"
        )
