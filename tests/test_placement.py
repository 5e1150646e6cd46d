"""Ranks that outnumber the CPUs they may use spread evenly over them: of the ranks sharing a
set of CPUs, rank i goes to the (i mod n)-th CPU of the set when its communicator is created, and
back there when a crowded wait finds it elsewhere (left alone, the kernel kept 4 ranks on 2 CPUs
3 + 1 for whole runs in half the launches). Nothing is pinned: the allowed set stays what it
was. A machine is a running kernel, so "hosts" in network namespaces of this one share its CPUs
and spread together. Every rank first limits itself to the same 2 CPUs (the first and last this
process may use), so that 4 ranks outnumber them on any machine.

Run as a script, this file is one rank of the namespace test.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from datetime import timedelta

import netns_ranks
import numpy as np
import pytest
from weft_proc import Ranks

USABLE = sorted(os.sched_getaffinity(0))
CPUS = [USABLE[0], USABLE[-1]]
RANKS = 2 * len(CPUS)
SAMPLES = 20
TWO_CPUS = pytest.mark.skipif(len(USABLE) < 2, reason="needs 2 CPUs; this process may use 1")


def on_cpu() -> int:
    """The CPU this thread last ran on (the "processor" field of /proc's stat)."""
    with open("/proc/thread-self/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[36])


def sample_cpus(rank, size, store, samples):
    """Small allreduces on CPUS, and after every 200 the CPU this rank is on."""
    import weft

    os.sched_setaffinity(0, CPUS)
    comm = weft.Communicator(store, rank, size, timeout=60)
    x = np.ones(2, np.float32)
    seen = []
    for _ in range(samples):
        for _ in range(200):
            comm.allreduce(x)
        seen.append(on_cpu())
    return {"cpus": seen, "allowed": sorted(os.sched_getaffinity(0))}


def check_spread(seen: list[dict]) -> None:
    for rank, got in enumerate(seen):
        assert got["allowed"] == CPUS, f"rank {rank} was left pinned: {got['allowed']}"
        want = CPUS[rank % len(CPUS)]
        share = sum(cpu == want for cpu in got["cpus"]) / len(got["cpus"])
        assert share >= 0.8, (
            f"rank {rank} was on CPU {want} in {share:.0%} of the samples, "
            f"on these CPUs: {got['cpus']}"
        )


@TWO_CPUS
def test_ranks_outnumbering_cpus_spread_evenly_over_them():
    with Ranks(sample_cpus, RANKS, SAMPLES) as ranks:
        check_spread(ranks.results(timeout=180))


@TWO_CPUS
def test_hosts_on_one_machine_spread_over_its_cpus():
    """Two namespace "hosts" of 2 ranks: each host alone fits its 2 CPUs, but together they
    outnumber them."""
    import weft.netns

    reason = weft.netns.unavailable()
    if reason:
        pytest.skip(reason)
    env = {k: v for k, v in os.environ.items() if not k.startswith("WEFT_")}
    with weft.netns.Hosts(2) as net:
        argvs = [
            [sys.executable, __file__, f"--rank={rank}", f"--size={RANKS}", net.ips[0]]
            for rank in range(RANKS)
        ]
        check_spread(netns_ranks.reports(net, len(CPUS), argvs, env, timeout=180))


# More ranks than two per CPU take turns on them: recursive doubling folds each CPU's ranks.
CROWD = 4 * len(CPUS)
# A communicator of some of the crowd, which keeps the world's spread: ranks 0, 2, 4 and 6 run
# on the first CPU, rank 1 on the second.
PART = [0, 2, 4, 6, 1]
STEP = re.compile(r"allreduce #\d+ .*step \d+/\d+ recv_from=(-?\d+) send_to=(-?\d+)")


def fold_by_cpu(rank, size, store, counts):
    """rd allreduces on CROWD ranks limited to CPUS, against numpy; what the world and a
    communicator of PART say about which ranks share a CPU."""
    import weft

    os.sched_setaffinity(0, CPUS)
    world = weft.Communicator(store, rank, size, timeout=60, algo="rd")
    part = None
    if rank in PART:
        part = weft.Communicator(store, PART.index(rank), len(PART), name="part", timeout=60)
    wrong = []
    for count in counts:
        inputs = [np.arange(count, dtype=np.float32) % 7 * (r + 1) for r in range(size)]
        for op, fold in (("sum", np.sum), ("max", np.max), ("avg", np.mean)):
            want = fold(inputs, 0)
            for in_place in (True, False):
                mine = inputs[rank].copy()
                out = None if in_place else np.empty_like(mine)
                got = world.allreduce(mine, op=op, out=out)
                got = mine if in_place else got
                if not np.allclose(got, want):
                    wrong.append(f"{op} of {count}, in place {in_place}: {got[:4]} not {want[:4]}")
    world.barrier()
    return {"world": world.shared_cpu, "part": part.shared_cpu if part else None, "wrong": wrong}


@TWO_CPUS
def test_recursive_doubling_folds_the_ranks_of_each_cpu():
    """With CROWD ranks on 2 CPUs, rd's rounds run between one rank per CPU: the others only
    hand their input to their CPU's first rank and take the result from it (the trace log's
    steps say whom each rank talks to)."""
    counts = (0, 1, 5, 4099)
    with Ranks(fold_by_cpu, CROWD, counts, env={"WEFT_DEBUG": "TRACE"}) as ranks:
        seen = ranks.results(timeout=180)
        logs = [ranks.stderr(r) for r in range(CROWD)]
    # With 2 CPUs, rank c (0 or 1) is the first rank of CPU c, and the other CPU's is 1 - c.
    cpu_of = [r % len(CPUS) for r in range(CROWD)]
    for rank, got in enumerate(seen):
        assert not got["wrong"], f"rank {rank}: " + "; ".join(got["wrong"])
        assert got["world"] == cpu_of, f"rank {rank}: shared_cpu {got['world']}"
        if rank in PART:
            assert got["part"] == [PART[r] % len(CPUS) for r in range(len(PART))]
        talks_to = {int(p) for pair in STEP.findall(logs[rank]) for p in pair if int(p) >= 0}
        assert talks_to, f"rank {rank} logged no allreduce steps"
        first = cpu_of[rank]
        if rank != first:
            assert talks_to == {first}, f"rank {rank} talked to {sorted(talks_to)}"
        else:
            allowed = {r for r in range(CROWD) if cpu_of[r] == first and r != rank} | {1 - first}
            assert talks_to <= allowed, f"rank {rank} talked to {sorted(talks_to)}"


def main() -> None:
    import torch.distributed as dist

    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--size", type=int, required=True)
    parser.add_argument("store_ip", help="rank 0's address; its TCPStore listens on 29400")
    args = parser.parse_args()
    store = dist.TCPStore(
        args.store_ip,
        29400,
        args.size,
        args.rank == 0,
        timedelta(seconds=60),
        wait_for_workers=False,
    )
    print(json.dumps(sample_cpus(args.rank, args.size, store, SAMPLES)), flush=True)


if __name__ == "__main__":
    main()
