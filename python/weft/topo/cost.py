"""The tuner's alpha-beta-gamma cost model, for questions about worlds no machine here has.

>>> from weft import topo
>>> world = topo.Topology(size=1024, hosts=128, ranks_per_host=8, any_tcp=True)
>>> topo.choose("allreduce", 64 << 20, world)            # (algorithm, predicted seconds)
>>> topo.predict("ring", "allreduce", 64 << 20, world)

``Communicator.cost_model`` is the model a live communicator measured at creation, with its
timed Plans in ``.measured`` (which ``choose`` believes over the link figures at small sizes:
``MEASURED_BYTES`` per rank);
``save_cost_model`` writes one in the form ``WEFT_TUNE=<file>`` reads. A thorough probe
(``weft-bench --tune``) also measures each link's beta on a buffer past the caches
(``beta_large_s_per_b``, at ``large_bytes``); ``at_buffer(model, nbytes)`` is the model at a
call's size, which ``predict`` and ``choose`` price with. The worlds they take are
``weft.topo.Topology`` (topology.py), whose closed-form fields the C++ model reads.
"""

from weft._C.topo import (  # noqa: F401  (re-exported by weft.topo)
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
