"""Ranks on several "hosts": network namespaces on this machine (see weft.netns).

2 hosts x 2 ranks and 3 hosts x 2 ranks: shared memory inside a host, tcp across links limited
to RATE_MBIT; every allreduce algorithm that applies is checked against numpy on the ranks, and
the tuner must pick the hierarchical one for large messages (with the host links this slow, it
is the fastest by far), and the probe's tcp figure must be the link's rate. Skipped, with the
reason, without root or ip.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import netns_ranks
import pytest
import weft.netns

REASON = weft.netns.unavailable()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

WORKER = str(Path(__file__).resolve().parent / "netns_worker.py")
ALGOS = "hier,ring,rhd,tree,auto"
STORE_PORT = 29400  # every namespace has its own ports: this one is free in a new namespace
TIMEOUT_S = 240
RATE_MBIT = 400


@pytest.mark.parametrize(("hosts", "per_host"), [(2, 2), (3, 2)], ids=["2x2", "3x2"])
def test_hierarchical_across_namespaces(hosts, per_host):
    size = hosts * per_host
    env = {k: v for k, v in os.environ.items() if not k.startswith("WEFT_")}
    with weft.netns.Hosts(hosts, rate_mbit=RATE_MBIT) as net:
        store = f"--store={net.ips[0]}:{STORE_PORT}"
        argvs = [
            [sys.executable, WORKER, f"--rank={rank}", f"--size={size}", store, f"--algos={ALGOS}"]
            for rank in range(size)
        ]
        found = netns_ranks.reports(net, per_host, argvs, env, TIMEOUT_S)
    for rank, report in enumerate(found):
        assert report["errors"] == [], f"rank {rank}: wrong results {report['errors']}"
        assert report["chosen"]["hier"] == "hier"
        assert report["chosen"]["auto"] == "hier", f"rank {rank}: tuner chose {report['chosen']}"
        same_host = [p // per_host == rank // per_host for p in range(size)]
        want = ["self" if p == rank else ("shm" if same_host[p] else "tcp") for p in range(size)]
        assert report["transports"] == want
        # Each probe's tcp figure is one flow's on a host's link, which two pairs share in its
        # second round: the link's rate (tc's ceiling), not half of it.
        beta = sorted(report["tcp_beta_s_per_b"])[len(ALGOS.split(",")) // 2]
        link_rate = RATE_MBIT * 1e6 / 8
        assert 0.8 < beta * link_rate < 1.6, f"rank {rank}: tcp beta {beta} against the link's rate"


MPI_RANK = """
import json, numpy as np, weft
from mpi4py import MPI
world = MPI.COMM_WORLD
x = np.full(1000, world.rank + 1, dtype=np.float32)
world.Allreduce(MPI.IN_PLACE, x)
hosts = world.allgather(weft.host_id())
node = world.Split_type(MPI.COMM_TYPE_SHARED).size
if world.rank == 0:
    print(json.dumps({"hosts": hosts, "node": node, "sums": sorted(set(x.tolist()))}))
"""


def openmpi_missing() -> str | None:
    """Why OpenMPI's ranks cannot be started here (weft-bench's own check, then the vendor)."""
    from weft.bench.lineup import unavailable

    why = unavailable("mpi", 4, None, "mpirun")
    if why:
        return why
    version = subprocess.run(["mpirun", "--version"], capture_output=True, text=True).stdout
    return None if "Open MPI" in version else "mpirun is not OpenMPI's"


OPENMPI_MISSING = openmpi_missing()


@pytest.mark.skipif(OPENMPI_MISSING is not None, reason=OPENMPI_MISSING or "")
def test_openmpi_ranks_across_namespaces():
    """Hosts.mpirun (the hierarchical benchmark's OpenMPI launch): 2 ranks in each of 2
    namespaces, each namespace a node to OpenMPI and a host to weft, and an allreduce across
    them."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WEFT_")}
    with weft.netns.Hosts(2, rate_mbit=RATE_MBIT) as net:
        proc = net.mpirun(2, [sys.executable, "-c", MPI_RANK], env, stdout=subprocess.PIPE)
        out, _ = proc.communicate(timeout=TIMEOUT_S)
    assert proc.returncode == 0
    report = json.loads(out.decode().strip().splitlines()[-1])
    assert report["sums"] == [1 + 2 + 3 + 4]
    assert report["node"] == 2  # OpenMPI sees 2 ranks on rank 0's node, not 4
    hosts = report["hosts"]
    assert hosts[0] == hosts[1] != hosts[2] == hosts[3], hosts
