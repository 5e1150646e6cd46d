"""weft.topo: collective algorithms as data, and what they cost.

>>> from weft import topo
>>> ring = topo.builtin("allreduce", "ring", 5, count=7)   # every rank's Plan, as data
>>> topo.check(ring).ok                                    # right result, no deadlock
True
>>> world = topo.Topology(size=1024, hosts=128)
>>> topo.choose("allreduce", 64 << 20, world)            # (algorithm, predicted seconds)

- ``Algorithm`` (algorithm.py): a collective written out as every rank's channels of steps;
  ``algo.save(path)``, ``topo.load(path)``.
- ``Program`` (dsl.py): a small language to write an Algorithm by hand, a method per step kind.
- ``builtin`` (builtin.py): any built-in family's Plans as an Algorithm.
- ``load_msccl`` (msccl.py): MSCCL's algorithm XML as an Algorithm, thread blocks as channels.
- ``check`` (check.py): symbolic execution of an Algorithm: contributions, placement, bounds,
  finite buffering, deadlocks.
- ``run`` (run.py): an Algorithm that passes the checker, on a Communicator's real ranks.
- ``Topology`` (topology.py): a network of ranks, hosts, NICs and switches (builders, JSON,
  routes), which is also the closed-form model's view of a world.
- ``simulate`` (simulate.py): an event simulation of an Algorithm or built-in on a Topology.
- ``draw_topology``, ``draw_timeline``, ``draw_prediction`` (draw.py): pictures (matplotlib).
- The tuner's cost model (cost.py): ``CostModel``, ``predict``, ``choose``, ...
"""

from weft.topo.algorithm import (
    Algorithm,
    AlgorithmError,
    Channel,
    RankProgram,
    Span,
    Step,
    load,
)
from weft.topo.builtin import FAMILIES, builtin
from weft.topo.check import Problem, Report, check
from weft.topo.cost import (
    MEASURED_BYTES,
    CostModel,
    LinkCost,
    algorithms_for,
    at_buffer,
    choose,
    load_cost_model,
    predict,
    save_cost_model,
)
from weft.topo.draw import draw_prediction, draw_timeline, draw_topology
from weft.topo.dsl import Program, StepRef
from weft.topo.msccl import load_msccl
from weft.topo.run import prepare, run
from weft.topo.simulate import SimResult, simulate
from weft.topo.topology import CpuPool, Link, Topology, TopologyError, load_topology

__all__ = [
    "FAMILIES",
    "MEASURED_BYTES",
    "Algorithm",
    "AlgorithmError",
    "Channel",
    "CostModel",
    "CpuPool",
    "Link",
    "LinkCost",
    "Problem",
    "Program",
    "RankProgram",
    "Report",
    "SimResult",
    "Span",
    "Step",
    "StepRef",
    "Topology",
    "TopologyError",
    "algorithms_for",
    "at_buffer",
    "builtin",
    "check",
    "draw_prediction",
    "draw_timeline",
    "draw_topology",
    "choose",
    "load",
    "load_cost_model",
    "load_msccl",
    "load_topology",
    "predict",
    "prepare",
    "run",
    "save_cost_model",
    "simulate",
]
