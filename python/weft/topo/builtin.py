"""Every built-in algorithm's Plan as an Algorithm, so that it can be read, saved and checked.

>>> from weft import topo
>>> ring = topo.builtin("allreduce", "ring", 5, count=7)
>>> topo.check(ring).ok
True
"""

from __future__ import annotations

from weft._C.topo import TUNED
from weft._C.topo import plan as _plan
from weft.topo.algorithm import Algorithm, Channel, RankProgram, Span, Step

# The families of each collective (weft.algorithms() says which apply to a given world).
FAMILIES = {
    "allreduce": ("ring", "tree", "rd", "rhd", "hier", "oneshot"),
    "reduce_scatter": ("ring", "rhd"),
    "allgather": ("ring", "rhd"),
    "broadcast": ("chain", "tree"),
    "reduce": ("chain", "tree"),
    "alltoall": ("pairwise",),
    "gather": ("direct",),
    "scatter": ("direct",),
    "barrier": ("barrier",),
}


def host_layout(ranks: int, hosts) -> list[int]:
    """A host index per rank: ``hosts`` as a list, or a count of hosts holding equal blocks of
    consecutive ranks (as launchers number them)."""
    if hosts is None:
        return [0] * ranks
    if isinstance(hosts, int):
        if hosts < 1 or ranks % hosts:
            raise ValueError(f"{ranks} ranks do not split evenly over {hosts} hosts")
        return [r // (ranks // hosts) for r in range(ranks)]
    layout = list(hosts)
    if len(layout) != ranks:
        raise ValueError(f"hosts has {len(layout)} entries for {ranks} ranks")
    return layout


def builtin(
    collective: str,
    family: str,
    ranks: int,
    *,
    count: int = 7,
    root: int = 0,
    in_place: bool = False,
    avg: bool = False,
    hosts=None,
    elem_size: int = 4,
    slot_bytes: int = 256 << 10,
    slots: int = 8,
    shared_cpu: list[int] | None = None,
    channels: int = 2,
) -> Algorithm:
    """The Plans every rank's executor would run for ``collective`` in ``family`` on ``ranks``
    ranks, for calls of ``count`` elements, planned for connections of ``slots`` slots of
    ``slot_bytes`` (steps then push at most half of that, as communicators plan) and
    ``channels`` connection sets per peer (a communicator's WEFT_CHANNELS, 2 by default)."""
    if collective not in FAMILIES:
        raise ValueError(f"unknown collective {collective!r}: use one of {', '.join(FAMILIES)}")
    if family not in FAMILIES[collective]:
        raise ValueError(
            f"{collective} has no family {family!r}: use one of {', '.join(FAMILIES[collective])}"
        )
    layout = host_layout(ranks, hosts)
    programs = []
    name = family
    for rank in range(ranks):
        plan = _plan(
            collective,
            "auto" if collective not in TUNED else family,
            rank,
            ranks,
            count,
            elem_size=elem_size,
            root=root,
            in_place=in_place,
            finalize=avg,
            max_step_bytes=max(elem_size, slot_bytes * slots // 2),
            hosts=layout,
            shared_cpu=shared_cpu or [],
            channels=channels,
        )
        name = plan["algorithm"]
        programs.append(RankProgram(_channels(plan), plan["scratch"]))
    return Algorithm(
        name=name,
        collective=collective,
        ranks=ranks,
        count=count,
        programs=programs,
        root=root,
        in_place=in_place,
        avg=avg,
        elem_size=elem_size,
        slot_bytes=slot_bytes,
        slots=slots,
    )


def _channels(plan: dict) -> list[Channel]:
    """A Plan's steps sorted into its channels, each step's ``after`` (indices into the Plan's
    steps) becoming deps on (channel, index) pairs."""
    tags = plan["channel_tags"] or [0]
    channels = [Channel([], tag if len(tags) > 1 else None) for tag in tags]
    where = []  # (channel, index) of each of the Plan's steps
    for s in plan["steps"]:
        steps = channels[s["channel"]].steps
        where.append((s["channel"], len(steps)))
        steps.append(_step(s, [where[a] for a in s["after"]]))
    return channels


def _step(s: dict, deps: list[tuple[int, int]]) -> Step:
    def span(value):
        return None if value is None else Span(*value)

    return Step(
        kind=s["kind"],
        recv=s["recv"],
        send=s["send"],
        local=span(s["local"]),
        dst=span(s["dst"]),
        operand=span(s["operand"]),
        count=s["count"],
        finalize=s["finalize"],
        wait_sends=s["wait_sends"],
        copy_sends=s["copy_sends"],
        deps=deps,
    )
