"""WEFT_ALGO=file:PATH: the torch backend runs an Algorithm file for the collective it implements.

Each process group of the file's rank count loads the file when it is created (weft.topo JSON,
or MSCCL XML by its ``.xml`` suffix; a file that does not load stops the group's creation with
the reason). From then on every call of that collective whose size is a whole multiple of the
Algorithm's, in its form (in place or not), with its root, and with ``avg`` only where it has
finalize steps, runs the Algorithm scaled to that size through weft's executor, once the checker
has passed it for the group's connections at that scale (checked once per scale). Any other call
keeps weft's own choice, and says so once per size in the ``weft`` logger at INFO. An in-place
MSCCL reduce whose file leaves its root open (several ranks write their buffer) is loaded with
each of those ranks as root, and a call runs the one of its root.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import replace
from pathlib import Path

from weft.topo.algorithm import ROOTED, Algorithm, AlgorithmError
from weft.topo.check import check
from weft.topo.msccl import AmbiguousRoot, load_msccl
from weft.topo.msccl import load_file as load_algorithm_file
from weft.topo.run import plan_of, scaled

log = logging.getLogger("weft")
# (collective, count) -> calls that ran the file's Algorithm in this process.
RUNS: Counter = Counter()


def load_algorithms(spec: str) -> dict[int, Algorithm]:
    """The file's Algorithm by its root: one, or for an in-place MSCCL reduce whose file leaves
    its root open, one for each rank that may be it, loaded with that root."""
    try:
        return _by_root(Path(spec.removeprefix("file:")))
    except (OSError, AlgorithmError) as e:
        raise AlgorithmError(f"WEFT_ALGO={spec}: {e}") from e


def _by_root(path: Path) -> dict[int, Algorithm]:
    try:
        algo = load_algorithm_file(path)
    except AmbiguousRoot as e:
        return {root: load_msccl(path, root=root) for root in e.roots}
    return {algo.root: algo}


class PlanSource:
    """This rank's Plan of the Algorithm for each call that fits it, or None. ``algos``: the
    Algorithm by its root (``load_algorithms``), alike but for the root."""

    def __init__(self, algos: dict[int, Algorithm], rank: int):
        self.algos, self.rank = algos, rank
        self.algo = next(iter(algos.values()))  # what they share: collective, count, form
        self.plans: dict[tuple, dict] = {}
        self.declined: set[tuple] = set()

    def __call__(self, count, elem_size, root, in_place, avg, slot_bytes, slots) -> dict | None:
        why = self.declines(count, root, in_place, avg)
        if why:
            if (count, in_place, root, avg) not in self.declined:
                self.declined.add((count, in_place, root, avg))
                log.info(
                    "WEFT_ALGO=file: %s of %d elements takes weft's own choice: %s",
                    self.algo.collective,
                    count,
                    why,
                )
            return None
        algo = self.algos[root]
        factor = count // algo.count
        key = (root, factor, elem_size, avg, slot_bytes, slots)
        if key not in self.plans:
            as_run = replace(algo, elem_size=elem_size, avg=avg)
            report = check(as_run, slots=slots, slot_bytes=slot_bytes, scale=factor)
            if not report.ok:
                at_root = f" with root {root}" if algo.collective in ROOTED else ""
                raise AlgorithmError(
                    f"WEFT_ALGO=file: {algo.name} fails the checker at {count} elements{at_root} "
                    f"for this group's connections ({slots} slots of {slot_bytes} bytes):\n"
                    f"{report}"
                )
            self.plans[key] = plan_of(scaled(as_run, factor), self.rank)
        RUNS[(algo.collective, count)] += 1
        return self.plans[key]

    def declines(self, count, root, in_place, avg) -> str | None:
        """Why a call does not fit the Algorithm, or None."""
        algo = self.algo
        if count == 0 or count % algo.count:
            return f"{count} elements are not a whole multiple of its {algo.count}"
        if in_place != algo.in_place:
            return "it is in place" if algo.in_place else "it is not in place"
        if root not in self.algos:
            return f"its root is {_either(sorted(self.algos))}"
        if avg and not algo.avg:
            return "it has no finalize steps for avg"
        return None


def _either(ranks: list[int]) -> str:
    """2; 2 or 3; 1, 2 or 3."""
    names = [str(r) for r in ranks]
    return " or ".join(filter(None, [", ".join(names[:-1]), names[-1]]))


def install(backend, spec: str, rank: int, size: int) -> None:
    """Makes the torch ``backend`` (a weft Backend of ``size`` ranks) run the file's Algorithm."""
    from weft import _C, _C_torch

    source = PlanSource(load_algorithms(spec), rank)
    algo = source.algo
    if algo.ranks != size:
        log.info(
            "WEFT_ALGO=%s is for %d ranks: a group of %d keeps weft's choice",
            spec,
            algo.ranks,
            size,
        )
        return
    if len(source.algos) > 1:
        log.info(
            "WEFT_ALGO=%s leaves the %s's root open (ranks %s may be it): each call runs it "
            "with the call's root",
            spec,
            algo.collective,
            _either(sorted(source.algos)),
        )
    communicator = _C_torch.communicator_of(backend)
    _C.topo.set_plan_source(communicator, algo.collective, source)
