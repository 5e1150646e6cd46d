"""The ofi transport (the RDMA protocol over libfabric) between real processes, over
libfabric's tcp provider (FI_EP_MSG) and its shm provider (FI_EP_RDM): every collective
against numpy, messages on the eager and the rendezvous paths, many sends in flight, the torch
backend against gloo, a wrong memory key refused, a peer killed mid-transfer. Skips, with the
reason, where libfabric or a provider is missing."""

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
from weft_ref import DTYPES, OPS, assert_no_mismatch
from weft_torch import assert_same

MISSING = ofi_missing("tcp")
pytestmark = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")
SHM_MISSING = ofi_missing("shm", "FI_EP_RDM")
needs_shm_provider = pytest.mark.skipif(SHM_MISSING is not None, reason=SHM_MISSING or "")

# Fewer dtypes for the larger worlds and small slots (the full set runs at 2 ranks): integers,
# the float16 and bfloat16 that are reduced through float32, and float64.
SOME_DTYPES = ("np.int32", "np.float16", "np.float64", "torch.bfloat16")
TWO_DTYPES = ("np.int32", "torch.bfloat16")
ONE_DTYPE = ("np.int32",)
# Every op at 2 and 3 ranks; beyond, one of each kind (summing, ordering, dividing).
SOME_OPS = ("sum", "min", "avg")
# 16383 and 16385 4-byte elements lie either side of the 64 KiB eager limit for a message
# that carries a whole buffer (broadcast, the one-shot algorithms); 2**18 + 1 crosses it in
# every algorithm (the 1 MiB slots too).
PATH_COUNTS = (0, 1, 7, 16383, 16385, 2**18 + 1)

WORLDS = [
    pytest.param(n, "ofi-tcp", c, dtypes, ops, PATH_COUNTS, id=f"{c}-ws{n}")
    for n, dtypes, ops in (
        (2, DTYPES, OPS),
        (3, SOME_DTYPES, OPS),
        (4, ONE_DTYPE, SOME_OPS),
        (5, ONE_DTYPE, SOME_OPS),
    )
    for c in COLLECTIVES
] + [
    # four 4 KiB slots: every message eager, senders waiting on credits
    pytest.param(3, "ofi-tcp-small", c, ONE_DTYPE, SOME_OPS, PATH_COUNTS, id=f"{c}-ws3-small")
    for c in COLLECTIVES
]


@pytest.mark.parametrize(("size", "transport", "collective", "dtypes", "ops", "counts"), WORLDS)
def test_collective(pools, size, transport, collective, dtypes, ops, counts):
    per_rank = pools.get(size, transport).run(COLLECTIVES[collective], dtypes, ops, counts)
    assert_no_mismatch(per_rank)


@pytest.mark.parametrize(("size", "transport"), [(3, "ofi-tcp"), (3, "ofi-tcp-small")])
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
    pool = pools.get(3, "ofi-shm")
    assert_no_mismatch(pool.run(COLLECTIVES[collective], TWO_DTYPES, SOME_OPS, PATH_COUNTS))


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


@pytest.mark.parametrize("case", ["all_reduce", "all_gather", "p2p", "ddp"])
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
    within the timeout."""
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
    # The tcp provider fails the write at the initiator, or closes the connection over it
    # (FI_SHUTDOWN on both sides), whichever each rank notices first.
    for rank, result in enumerate(got):
        message = result["large"]["message"]
        assert "write failed" in message or "FI_SHUTDOWN" in message, f"rank {rank}: {message}"


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


def case_count_writes(ctx, count):
    """The writes each rank's connections post for one 2-rank allreduce of ``count`` floats."""
    import numpy as np
    import weft

    buf = np.ones(count, np.float32)
    ctx.comm.barrier()
    before = weft._C.rdma_writes()
    ctx.comm.allreduce(buf)
    ctx.comm.barrier()
    after = weft._C.rdma_writes()
    return {kind: after[kind] - before[kind] for kind in after}


@pytest.mark.parametrize("count", [1000, 2**20])
def test_write_counts_follow_the_protocol(pools, count):
    """Small messages go eagerly (no rendezvous write at all), large ones by rendezvous, where
    each ready-to-send of one rank meets one clear-to-send of the other and one payload write
    of its own; a receiver credits at most one write per message it received."""
    mine, theirs = pools.get(2, "ofi-tcp").run(case_count_writes, count)
    for me, peer in ((mine, theirs), (theirs, mine)):
        messages = me["eager"] + me["ready_to_send"]
        assert messages > 0, me
        if count == 1000:
            assert me["ready_to_send"] == me["payload"] == peer["clear_to_send"] == 0, (me, peer)
        else:
            assert me["ready_to_send"] > 0, me
            assert me["ready_to_send"] == peer["clear_to_send"] == me["payload"], (me, peer)
        # The first barrier's messages, sent before the count began, may be credited in it.
        assert 0 < peer["credit"] <= messages + 2, (me, peer)
