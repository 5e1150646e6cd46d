"""The measurement loop every system runs, in every rank, on the same plan.

Per op, size and form: one checked call on patterned inputs (with -c), `warmup` untimed calls
on zeroed buffers (zeros stay zeros however often they are reduced), more untimed calls while
the system still tries algorithms at that size (weft's tuner; at most MAX_TRIAL_CALLS, the
count recorded as "trial_calls"), the system's barrier, then
`iters` timed calls (more at small sizes with --iter-bytes, see timed_calls), the clock stopped
once the last one is done. A rank's time per call is the elapsed time / iters (nccl-tests'
mean); the caller takes the slowest rank's (results.py).

The loop's own tensor work (filling, zeroing, checking) runs on one thread: torch's OpenMP
threads keep spinning after each parallel region, and on a machine with fewer cores than ranks
they take the CPU from the ranks being measured (on 2 cores, 4 ranks over tcp, that doubled
weft's time at 512 KiB).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from weft.bench import ops
from weft.bench.sizes import timed_calls
from weft.bench.systems import System, Unsupported

# Bounds the extra warmup for a system's trials (weft's: at most 4 families x 3 rounds x 64).
MAX_TRIAL_CALLS = 768


def run_plan(
    variants: dict[str, tuple[System, list[str]]],
    plan: dict,
    rank: int,
    size: int,
    step: Callable[[], None],
) -> dict[str, dict]:
    """This rank's measurements of `plan` (see cli.make_plan) over each variant: name ->
    (system, the ops it runs). Several variants (weft's algorithms, in one launch) take turns
    at each (op, size), so that the launch's conditions are the same for all of them.

    Returns name -> {"records": [...], "refused": {op: reason}, "unsupported": [reasons]};
    the records come in the same order on every rank. `step()` is called once per (op, size)
    of each variant.
    """
    torch.set_num_threads(1)
    dtype = ops.DTYPES[plan["dtype"]]
    elem_size = dtype.itemsize
    outs = {name: {"records": [], "refused": {}, "unsupported": []} for name in variants}
    for op_name in plan["ops"]:
        op = ops.OPS[op_name]
        for nbytes in plan["sizes"]:
            shape = ops.shape(op, nbytes, size, elem_size)
            for name, (system, its_ops) in variants.items():
                if op_name not in its_ops:
                    continue
                out = outs[name]
                if shape.block > 0 and op_name not in out["refused"]:
                    try:
                        for in_place in op.forms():
                            record = measure(system, op, in_place, shape, plan, rank, size, out)
                            if record:
                                out["records"].append(record)
                    except system.refusals as e:
                        out["refused"][op_name] = str(e)
                step()
    for system, _ in variants.values():
        system.barrier()
    return outs


def measure(system, op, in_place, shape, plan, rank, size, out) -> dict | None:
    dtype, root, device = ops.DTYPES[plan["dtype"]], plan["root"], system.device
    inp, output = ops.buffers(op, in_place, shape, size, rank, dtype, device)
    try:
        call = system.bind(op.name, in_place, inp, output, root)
    except Unsupported as e:
        if str(e) not in out["unsupported"]:
            out["unsupported"].append(str(e))
        return None
    wrong = None
    if plan["check"]:
        inp.copy_(ops.pattern(rank, 0, inp.numel(), device))
        call()
        system.sync()
        wrong = ops.count_wrong(output, ops.expected(op, shape, size, rank, root, device))
    inp.zero_()
    output.zero_()
    for _ in range(plan["warmup"]):
        call()
    block_bytes = shape.block * dtype.itemsize
    trial_calls = 0
    while trial_calls < MAX_TRIAL_CALLS and system.trying(op.name, block_bytes, in_place):
        call()
        trial_calls += 1
    system.sync()
    system.barrier()
    iters = timed_calls(plan, shape.count * dtype.itemsize)
    start = time.perf_counter()
    for _ in range(iters):
        call()
    system.sync()
    elapsed = time.perf_counter() - start
    record = {
        "op": op.name,
        "bytes": shape.count * dtype.itemsize,
        "count": shape.count,
        "in_place": in_place,
        "iters": iters,
        "time_s": elapsed / iters,
        "wrong": wrong,
    }
    algorithm = system.algorithm(op.name, block_bytes, in_place)
    if algorithm:
        record["algorithm"] = algorithm
        record["trial_calls"] = trial_calls
    return record
