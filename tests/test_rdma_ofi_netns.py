"""The ofi transport between two "hosts" (network namespaces on this machine, see weft.netns),
two ranks each, over libfabric's tcp provider: allreduce with the hierarchical algorithm and
the ring, checked against numpy on every rank, and every collective, dtype and op through
torch.distributed against gloo on the same inputs (tests/netns_worker.py). Skipped, with the
reason, without root, ip or libfabric."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import netns_ranks
import pytest
import weft.netns
from rdma_support import ofi_missing

REASON = weft.netns.unavailable() or ofi_missing("tcp")
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

WORKER = str(Path(__file__).resolve().parent / "netns_worker.py")
STORE_PORT = 29400  # every namespace has its own ports: this one is free in a new namespace
TIMEOUT_S = 240
# test_backend.py's cases: each collective in every dtype and op gloo takes, weft against gloo.
TORCH_CASES = "all_reduce,reduce,reduce_scatter,broadcast,all_gather,all_to_all,gather_scatter"


def test_two_hosts_of_two_ranks():
    hosts, per_host = 2, 2
    size = hosts * per_host
    env = {k: v for k, v in os.environ.items() if not k.startswith("WEFT_")}
    env.update({"WEFT_TRANSPORT": "ofi", "FI_PROVIDER": "tcp", "GLOO_SOCKET_IFNAME": "eth0"})
    with weft.netns.Hosts(hosts) as net:
        store = f"--store={net.ips[0]}:{STORE_PORT}"
        argvs = [
            [
                sys.executable,
                WORKER,
                f"--rank={rank}",
                f"--size={size}",
                store,
                "--algos=hier,ring",
                f"--torch-cases={TORCH_CASES}",
            ]
            for rank in range(size)
        ]
        found = netns_ranks.reports(net, per_host, argvs, env, TIMEOUT_S)
    for rank, report in enumerate(found):
        assert report["errors"] == [], f"rank {rank}: wrong results {report['errors'][:20]}"
        assert report["torch_checks"] > 1000, report["torch_checks"]  # operations compared
        want = ["self" if p == rank else "ofi" for p in range(size)]
        assert report["transports"] == want
