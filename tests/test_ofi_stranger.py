"""A stranger at the ofi transport's listener. Where the provider has FI_EP_MSG endpoints (tcp),
one rank of each connection listens for the other's connection request after the mesh is built,
on a port anyone can find and connect to. The connecting rank is held back
(WEFT_RDMA_FAULT=slow_connect) while a stranger, a libfabric program of its own
(tests/ofi_stranger.c), asks to connect with data that is not the token the listener sent its
peer over the authenticated control socket: the listener refuses it, logs it at INFO, accepts its
peer, and the job computes correct allreduces."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest
from listeners import listening
from rdma_support import ofi_missing
from test_auth import wrong_in_allreduces
from weft_proc import Ranks

MISSING = ofi_missing("tcp", "FI_EP_MSG")
if MISSING is None and shutil.which("cc") is None:
    MISSING = "no C compiler (cc) to build tests/ofi_stranger.c"
pytestmark = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")

SIZE = 2
TIMEOUT_S = 20.0
COUNTS = [1, 1000, 300_000]  # eager and rendezvous messages
STRANGER = Path(__file__).with_name("ofi_stranger.c")


def allreduces(rank, size, store, counts):
    import weft

    comm = weft.Communicator(store, rank, size, timeout=TIMEOUT_S)
    return {"wrong": wrong_in_allreduces(comm, counts), "transport": comm.transport_to(1 - rank)}


def test_a_stranger_at_the_ofi_listener_is_refused_and_the_job_goes_on(tmp_path):
    stranger = tmp_path / "ofi_stranger"
    subprocess.run(["cc", "-o", str(stranger), str(STRANGER), "-lfabric"], check=True, timeout=120)
    env = {"WEFT_TRANSPORT": "ofi", "FI_PROVIDER": "tcp", "WEFT_RDMA_FAULT": "slow_connect",
           "WEFT_DEBUG": "INFO", "WEFT_TUNE": "off"}  # fmt: skip
    outcomes = []
    with Ranks(allreduces, SIZE, COUNTS, env=env) as ranks:
        attacked: set[tuple[str, int]] = set()
        deadline = time.monotonic() + TIMEOUT_S + 30
        while not all(c.proc.poll() is not None for c in ranks.children):
            assert time.monotonic() < deadline, "the ranks never finished"
            for pid in ranks.pids:
                try:
                    found = listening(pid)
                except OSError:  # the rank exited while we looked
                    continue
                for ip, port in set(found) - attacked:
                    attacked.add((ip, port))
                    argv = [str(stranger), ip, str(port)]
                    run = subprocess.run(argv, capture_output=True, text=True, timeout=30,
                                         env={"FI_PROVIDER": "tcp"})  # fmt: skip
                    outcomes.append((port, run.returncode, run.stdout.strip()))
            time.sleep(0.02)
        results = ranks.results(30)
        logs = "".join(ranks.stderr(r) for r in range(SIZE))
    assert [r["transport"] for r in results] == ["ofi"] * SIZE
    assert all(r["wrong"] == 0 for r in results), results
    assert not [o for o in outcomes if o[1] == 1], f"a stranger got in: {outcomes}"
    assert "refused a connection request without this connection's token" in logs, outcomes
