"""The ofi transport (the RDMA protocol over libfabric) between real processes, over
libfabric's tcp provider: every collective against numpy, messages on the eager and the
rendezvous paths, many sends in flight, the torch backend against gloo, a peer killed
mid-transfer. Skips, with the reason, where libfabric or its tcp provider is missing."""

from __future__ import annotations

import os
import signal
import time

import pytest
from rdma_support import ofi_missing
from test_backend import CASES as BACKEND_CASES
from test_collectives import (
    COLLECTIVES,
    case_alltoall,
    case_async_ops,
    case_barrier,
    case_gather,
    case_scatter,
    case_send_recv_ring,
    case_tags_in_order,
    uneven_counts,
)
from test_errors import PEER_1, SHORT_TIMEOUT_S, SLACK_S, scenario_allreduce_loop
from weft_proc import Ranks, outcome, processes_with_token
from weft_ref import COUNTS, DTYPES, OPS, assert_no_mismatch
from weft_torch import assert_same

MISSING = ofi_missing("tcp")
pytestmark = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")
SHM_MISSING = ofi_missing("shm", "FI_EP_RDM")
needs_shm_provider = pytest.mark.skipif(SHM_MISSING is not None, reason=SHM_MISSING or "")

# Fewer dtypes for the larger worlds (the full set runs at 2 ranks): integers, the float16
# and bfloat16 that are reduced through float32, and float64.
SOME_DTYPES = ("np.int32", "np.float16", "np.float64", "torch.bfloat16")
TWO_DTYPES = ("np.int32", "torch.bfloat16")
# Counts around the eager limit (64 KiB) and the 1 MiB slots: 4-byte elements put 16383 on
# the eager path and 16385 and 2**20 + 3 (several slots) on the rendezvous path.
PATH_COUNTS = (0, 1, 7, 16383, 16385, 2**18 + 1)

WORLDS = [
    pytest.param(n, "ofi-tcp", c, dtypes, counts, id=f"{c}-ws{n}")
    for n, dtypes, counts in (
        (2, DTYPES, COUNTS),
        (3, SOME_DTYPES, PATH_COUNTS),
        (4, TWO_DTYPES, PATH_COUNTS),
        (5, TWO_DTYPES, PATH_COUNTS),
    )
    for c in COLLECTIVES
] + [
    # four 4 KiB slots: every message eager, senders waiting on credits
    pytest.param(3, "ofi-tcp-small", c, TWO_DTYPES, PATH_COUNTS, id=f"{c}-ws3-small")
    for c in COLLECTIVES
]


@pytest.mark.parametrize(("size", "transport", "collective", "dtypes", "counts"), WORLDS)
def test_collective(pools, size, transport, collective, dtypes, counts):
    per_rank = pools.get(size, transport).run(COLLECTIVES[collective], dtypes, OPS, counts)
    assert_no_mismatch(per_rank)


@pytest.mark.parametrize(("size", "transport"), [(3, "ofi-tcp"), (4, "ofi-tcp-small")])
def test_data_movement(pools, size, transport):
    """alltoall with uneven counts, gather, scatter, a send/recv ring and barriers."""
    pool = pools.get(size, transport)
    matrices = [
        ("uneven", uneven_counts(size, 1000, 1), True),
        ("even", [[7] * size] * size, False),
    ]
    assert_no_mismatch(pool.run(case_alltoall, TWO_DTYPES, matrices))
    assert_no_mismatch(pool.run(case_gather, TWO_DTYPES, (0, 1, 7, 2**18 + 1)))
    assert_no_mismatch(pool.run(case_scatter, TWO_DTYPES, (0, 1, 7, 2**18 + 1)))
    assert_no_mismatch(pool.run(case_send_recv_ring, TWO_DTYPES, (0, 1, 2**18 + 1), True))
    results = pool.run(case_barrier, delay_s=0.2, repeats=10)
    for turn, (late, *_) in enumerate(results[0]):
        entered = results[late][turn][1]
        early = [rank for rank, turns in enumerate(results) if turns[turn][2] < entered]
        assert not early, f"ranks {early} left the barrier before rank {late} entered it"


@needs_shm_provider
@pytest.mark.parametrize("collective", list(COLLECTIVES))
def test_collective_over_shm_provider(pools, collective):
    """The same protocol over FI_EP_RDM endpoints (libfabric's shm provider), where writes
    need not land in order."""
    per_rank = pools.get(3, "ofi-shm").run(COLLECTIVES[collective], TWO_DTYPES, OPS, PATH_COUNTS)
    assert_no_mismatch(per_rank)


@needs_shm_provider
def test_data_movement_over_shm_provider(pools):
    test_data_movement(pools, 3, "ofi-shm")


@pytest.mark.parametrize(("size", "transport"), [(3, "ofi-tcp"), (3, "ofi-tcp-small")])
def test_many_in_flight(pools, size, transport):
    """Many async operations and tagged sends outstanding at once, waited in reverse order."""
    pool = pools.get(size, transport)
    for count in (1, 2**18 + 1):
        assert_no_mismatch(pool.run(case_async_ops, TWO_DTYPES, count, "reverse"))
        assert_no_mismatch(pool.run(case_tags_in_order, count))


@pytest.mark.parametrize("case", ["all_reduce", "reduce_scatter", "all_gather", "p2p", "ddp"])
def test_torch_backend_against_gloo(pools, case):
    """torch.distributed over weft's ofi transport gives what gloo gives (test_backend.py)."""
    assert_same(pools.get(3, "ofi-tcp").run(BACKEND_CASES[case]))


def scenario_bad_key(rank, size, store, timeout_s):
    import numpy as np
    import weft

    comm = weft.Communicator(store, rank, size, timeout=timeout_s)
    small = outcome(lambda: comm.allreduce(np.ones(1000, np.float32)).tolist()[:2])
    large = outcome(lambda: comm.allreduce(np.ones(2**20, np.float32)))
    return {"small": small, "large": large}


def test_bad_memory_key_is_refused():
    """Clear-to-send entries naming a wrong key (WEFT_RDMA_FAULT=bad_key): eager messages
    still go, the payload writes are refused by the provider and both ranks get a PeerError
    within the timeout, the sender's naming the failed write."""
    env = {"WEFT_TRANSPORT": "ofi", "FI_PROVIDER": "tcp", "WEFT_RDMA_FAULT": "bad_key"}
    env["WEFT_TUNE"] = "off"  # the tuner's probes at start-up would hit the fault first
    per_rank = lambda rank: {"WEFT_HOST_ID": f"weft-ofi-key-{rank}"}  # noqa: E731
    with Ranks(scenario_bad_key, 2, SHORT_TIMEOUT_S, env=env, env_per_rank=per_rank) as ranks:
        got = [ranks.result(r, timeout=SHORT_TIMEOUT_S + SLACK_S + 60) for r in range(2)]
    for rank, result in enumerate(got):
        assert result["small"].get("value") == [2.0, 2.0], f"rank {rank}: {result['small']}"
        large = result["large"]
        assert large["raised"] == "PeerError", f"rank {rank}: {large}"
        assert large["elapsed"] < SHORT_TIMEOUT_S + SLACK_S, f"rank {rank}: {large}"
    messages = " | ".join(r["large"]["message"] for r in got)
    assert "write failed" in messages, messages


def test_sigkill_peer_during_allreduce():
    """A peer killed in the middle of 256 MiB allreduces: PeerError on the others in time."""
    env = {"WEFT_TRANSPORT": "ofi", "FI_PROVIDER": "tcp"}
    args = (256 * 2**20, SHORT_TIMEOUT_S)
    per_rank = lambda rank: {"WEFT_HOST_ID": f"weft-ofi-kill-{rank}"}  # noqa: E731
    with Ranks(scenario_allreduce_loop, 3, *args, env=env, env_per_rank=per_rank) as ranks:
        ranks.wait_mark(1, "looping", timeout=180)
        time.sleep(0.3)
        os.kill(ranks.pids[1], signal.SIGKILL)
        killed_at = time.time()
        survivors = {r: ranks.result(r, timeout=SHORT_TIMEOUT_S + SLACK_S + 30) for r in (0, 2)}
        exits = {r: ranks.wait_exit(r, timeout=30) for r in range(3)}
        left = processes_with_token(ranks.token)
    problems = []
    for rank, got in survivors.items():
        error = got["error"]
        if error["raised"] != "PeerError":
            problems.append(f"rank {rank}: expected PeerError, got {error}")
            continue
        if error["time"] - killed_at > SHORT_TIMEOUT_S + SLACK_S:
            problems.append(f"rank {rank}: PeerError {error['time'] - killed_at:.1f} s after")
        if not PEER_1.search(error["message"]):
            problems.append(f"rank {rank}: message does not name peer 1: {error['message']!r}")
        if got["after"]["raised"] not in ("AbortedError", "PeerError"):
            problems.append(f"rank {rank}: next allreduce: expected AbortedError, got {got}")
    problems += [f"rank {r} exited with {c}" for r, c in exits.items() if r != 1 and c != 0]
    if left:
        problems.append(f"processes left behind: {left}")
    assert not problems, "\n".join(problems)
