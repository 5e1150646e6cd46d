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
