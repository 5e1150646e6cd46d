"""The measurement loop every system runs, in every rank, on the same plan.

Per op, size and form: one checked call on patterned inputs (with -c), `warmup` untimed calls
on zeroed buffers (zeros stay zeros however often they are reduced), more untimed calls while
the system still tries algorithms at that size (weft's tuner; at most MAX_TRIAL_CALLS, the
count recorded as "trial_calls"), then the timed calls (-n, more at small sizes with
--iter-bytes, see timed_calls) in --rounds blocks: each block starts after the system's
barrier and its clock stops once the block's last call is done. A rank's time per call in a
block is the block's elapsed time / its calls (nccl-tests' mean); the caller takes the
slowest rank's per block (results.py), and the median over the blocks. Each block also
records the CPU time its rank's process spent per call, every thread, waiting included: what
the calls cost the machine's CPUs, which the caller sums over the ranks. The total comes from
CLOCK_PROCESS_CPUTIME_ID: exact for the calling thread, while the process's other threads
(gloo's, weft's worker) count up to their last scheduler tick or switch. The kernel's part
comes from getrusage, which splits the time by ticks (and is held to the total). Both mean
something for blocks much longer than a tick (1-4 ms), not for blocks of microseconds.

Several variants (weft's algorithms, in one launch) share the buffers of each (op, size,
form) and take turns block by block, the order rotating each round: a burst of background
load on a crowded machine (4 ranks on 2 cores: one family's 4 MiB allreduce ran 8.6 ms in
one block and 5.0-6.2 in the others') then lands in one block of one variant, which the
median sets aside, rather than in all of that variant's calls.

The loop's own tensor work (filling, zeroing, checking) runs on one thread: torch's OpenMP
threads keep spinning after each parallel region, and on a machine with fewer cores than ranks
they take the CPU from the ranks being measured (on 2 cores, 4 ranks over tcp, that doubled
weft's time at 512 KiB).
"""

from __future__ import annotations

import resource
import statistics
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
    (system, the ops it runs). Several variants take turns at each (op, size, form), so that
    the launch's conditions are the same for all of them.

    Returns name -> {"records": [...], "refused": {op: reason}, "unsupported": [reasons],
    "buffering": System.buffering()};
    the records come in the same order on every rank. `step()` is called once per (op, size)
    of each variant.
    """
    torch.set_num_threads(1)
    outs = {
        name: {"records": [], "refused": {}, "unsupported": [], "buffering": system.buffering()}
        for name, (system, _) in variants.items()
    }
    for op_name in plan["ops"]:
        op = ops.OPS[op_name]
        elem_size = ops.DTYPES[plan["dtype"]].itemsize
        for nbytes in plan["sizes"]:
            shape = ops.shape(op, nbytes, size, elem_size)
            running = [name for name, (_, its_ops) in variants.items() if op_name in its_ops]
            if shape.block > 0:
                for in_place in op.forms():
                    here = {n: variants[n][0] for n in running if op_name not in outs[n]["refused"]}
                    measure(here, op, in_place, shape, plan, rank, size, outs)
            for _ in running:
                step()
    for system, _ in variants.values():
        system.barrier()
    return outs


def measure(systems, op, in_place, shape, plan, rank, size, outs) -> None:
    """Every system of `systems` (name -> System) on one (op, size, form): each readied in
    turn, then their timed blocks in turns; appends each one's record to outs[name]."""
    dtype = ops.DTYPES[plan["dtype"]]
    buffers: dict[str, tuple] = {}  # per device, shared by the systems on it
    ready = {}
    for name, system in systems.items():
        device = system.device
        if device not in buffers:
            buffers[device] = ops.buffers(op, in_place, shape, size, rank, dtype, device)
        try:
            ready[name] = ready_call(system, op, in_place, shape, plan, rank, size, buffers[device])
        except Unsupported as e:
            if str(e) not in outs[name]["unsupported"]:
                outs[name]["unsupported"].append(str(e))
        except system.refusals as e:
            outs[name]["refused"][op.name] = str(e)
    if not ready:
        return
    rounds = plan.get("rounds", 1)
    calls = -(-timed_calls(plan, shape.count * dtype.itemsize) // rounds)
    block_times: dict[str, list[float]] = {name: [] for name in ready}
    block_cpu: dict[str, list[list[float]]] = {name: [] for name in ready}
    names = list(ready)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            system, call = systems[name], ready[name][0]
            system.barrier()
            kernel0 = resource.getrusage(resource.RUSAGE_SELF).ru_stime
            cpu0, start = time.process_time(), time.perf_counter()
            for _ in range(calls):
                call()
            system.sync()
            end, cpu = time.perf_counter(), time.process_time() - cpu0
            kernel = resource.getrusage(resource.RUSAGE_SELF).ru_stime - kernel0
            block_times[name].append((end - start) / calls)
            block_cpu[name].append([cpu / calls, min(kernel, cpu) / calls])
    for name, (_, record) in ready.items():
        record["iters"] = calls * rounds
        record["time_s"] = statistics.median(block_times[name])
        if rounds > 1:
            record["round_times_s"] = block_times[name]
        record["round_cpu_s"] = block_cpu[name]
        outs[name]["records"].append(record)


def ready_call(system, op, in_place, shape, plan, rank, size, bufs) -> tuple[Callable, dict]:
    """`system`'s call of the op on `bufs`, checked (with -c), warmed up and past its trials
    of algorithms, with the record that its timing completes."""
    dtype, root, device = ops.DTYPES[plan["dtype"]], plan["root"], system.device
    inp, output = bufs
    call = system.bind(op.name, in_place, inp, output, root)
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
    record = {
        "op": op.name,
        "bytes": shape.count * dtype.itemsize,
        "count": shape.count,
        "in_place": in_place,
        "wrong": wrong,
    }
    algorithm = system.algorithm(op.name, block_bytes, in_place)
    if algorithm:
        record["algorithm"] = algorithm
        record["trial_calls"] = trial_calls
    return call, record
