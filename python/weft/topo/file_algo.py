"""WEFT_ALGO=file:PATH: the torch backend runs an Algorithm file for the collective it implements.

Each process group of the file's rank count loads the file when it is created (weft.topo JSON,
or MSCCL XML by its ``.xml`` suffix; a file that does not load stops the group's creation with
the reason). From then on every call of that collective whose size is a whole multiple of the
Algorithm's, in its form (in place or not), with its root, and with ``avg`` only where it has
finalize steps, runs the Algorithm scaled to that size through weft's executor, once the checker
has passed it for the group's connections at that scale (checked once per scale). Any other call
keeps weft's own choice, and says so once per size in the ``weft`` logger at INFO.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import replace
from pathlib import Path

from weft.topo.algorithm import Algorithm, AlgorithmError
from weft.topo.check import check
from weft.topo.msccl import load_file as load_algorithm_file
from weft.topo.run import plan_of, scaled

log = logging.getLogger("weft")
# (collective, count) -> calls that ran the file's Algorithm in this process.
RUNS: Counter = Counter()


def load_file(spec: str) -> Algorithm:
    try:
        return load_algorithm_file(Path(spec.removeprefix("file:")))
    except (OSError, AlgorithmError) as e:
        raise AlgorithmError(f"WEFT_ALGO={spec}: {e}") from e


class PlanSource:
    """This rank's Plan of the Algorithm for each call that fits it, or None."""

    def __init__(self, algo: Algorithm, rank: int):
        self.algo, self.rank = algo, rank
        self.plans: dict[tuple, dict] = {}
        self.declined: set[tuple] = set()

    def __call__(self, count, elem_size, root, in_place, avg, slot_bytes, slots) -> dict | None:
        algo = self.algo
        why = None
        if count == 0 or count % algo.count:
            why = f"{count} elements are not a whole multiple of its {algo.count}"
        elif in_place != algo.in_place:
            why = "it is in place" if algo.in_place else "it is not in place"
        elif root != algo.root:
            why = f"its root is {algo.root}"
        elif avg and not algo.avg:
            why = "it has no finalize steps for avg"
        if why:
            if (count, in_place, root, avg) not in self.declined:
                self.declined.add((count, in_place, root, avg))
                log.info(
                    "WEFT_ALGO=file: %s of %d elements takes weft's own choice: %s",
                    algo.collective,
                    count,
                    why,
                )
            return None
        factor = count // algo.count
        key = (factor, elem_size, avg, slot_bytes, slots)
        if key not in self.plans:
            as_run = replace(algo, elem_size=elem_size, avg=avg)
            report = check(as_run, slots=slots, slot_bytes=slot_bytes, scale=factor)
            if not report.ok:
                raise AlgorithmError(
                    f"WEFT_ALGO=file: {algo.name} fails the checker at {count} elements for this "
                    f"group's connections ({slots} slots of {slot_bytes} bytes):\n{report}"
                )
            self.plans[key] = plan_of(scaled(as_run, factor), self.rank)
        RUNS[(algo.collective, count)] += 1
        return self.plans[key]


def install(backend, spec: str, rank: int, size: int) -> None:
    """Makes the torch ``backend`` (a weft Backend of ``size`` ranks) run the file's Algorithm."""
    from weft import _C, _C_torch

    algo = load_file(spec)
    if algo.ranks != size:
        log.info(
            "WEFT_ALGO=%s is for %d ranks: a group of %d keeps weft's choice",
            spec,
            algo.ranks,
            size,
        )
        return
    communicator = _C_torch.communicator_of(backend)
    _C.topo.set_plan_source(communicator, algo.collective, PlanSource(algo, rank))
