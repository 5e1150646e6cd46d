"""weft's RDMA protocol between real processes over each of its back ends (tests/rdma_backends.py):
``ofi`` over libfabric's tcp provider (FI_EP_MSG) and ``ibverbs`` over the verbs emulator (RC
queue pairs). Every collective against numpy, messages on the eager and the rendezvous paths,
many sends in flight, the torch backend against gloo, a wrong memory key refused, the writes
the protocol posts counted. Each back end skips, with the reason, where it cannot run."""

from __future__ import annotations

import pytest
import rdma_backends
from rdma_backends import BACKENDS, POOLS
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
from test_errors import SHORT_TIMEOUT_S, SLACK_S
from weft_proc import Ranks, outcome
from weft_ref import DTYPES, OPS, assert_no_mismatch
from weft_torch import assert_same

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

# Every test runs over each back end, grouped by back end (a module-scoped fixture), so that
# each back end's pools start once: the worlds are ordered so that the pools the later tests
# use (3 ranks, then 2) are the last ones started, and still alive (weft_pool keeps three).
WORLDS = [
    pytest.param(n, small, c, dtypes, ops, id=f"{c}-ws{n}{'-small' if small else ''}")
    for n, small, dtypes, ops in (
        (4, False, ONE_DTYPE, SOME_OPS),
        (5, False, ONE_DTYPE, SOME_OPS),
        (2, False, DTYPES, OPS),
        # four 4 KiB slots: every message eager, senders waiting on credits
        (3, True, ONE_DTYPE, SOME_OPS),
        (3, False, SOME_DTYPES, OPS),
    )
    for c in COLLECTIVES
]


@pytest.fixture(scope="module", params=[rdma_backends.param(b, b, id=b) for b in BACKENDS])
def backend(request):
    return request.param


def pool_name(backend: str, small: bool = False) -> str:
    return POOLS[backend][1 if small else 0]


@pytest.mark.parametrize(("size", "small", "collective", "dtypes", "ops"), WORLDS)
def test_collective(pools, backend, size, small, collective, dtypes, ops):
    pool = pools.get(size, pool_name(backend, small))
    assert_no_mismatch(pool.run(COLLECTIVES[collective], dtypes, ops, PATH_COUNTS))


def data_movement(pool):
    """alltoall with uneven counts, gather, scatter, a send/recv ring and barriers."""
    size = pool.size
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


@pytest.mark.parametrize("small", [True, False], ids=["small", "default"])
def test_data_movement(pools, backend, small):
    data_movement(pools.get(3, pool_name(backend, small)))


@pytest.mark.parametrize("small", [True, False], ids=["small", "default"])
def test_many_in_flight(pools, backend, small):
    """Many async operations and tagged sends outstanding at once, waited in reverse order."""
    pool = pools.get(3, pool_name(backend, small))
    for count in (1, 2**18 + 1):
        assert_no_mismatch(pool.run(case_async_ops, TWO_DTYPES, count, "reverse"))
        assert_no_mismatch(pool.run(case_tags_in_order, count))


@pytest.mark.parametrize("case", ["all_reduce", "all_gather", "p2p", "ddp"])
def test_torch_backend_against_gloo(pools, backend, case):
    """torch.distributed over weft's RDMA transports gives what gloo gives (test_backend.py)."""
    assert_same(pools.get(3, pool_name(backend)).run(BACKEND_CASES[case]))


def scenario_bad_key(rank, size, store, timeout_s):
    import numpy as np
    import weft

    comm = weft.Communicator(store, rank, size, timeout=timeout_s)
    small = outcome(lambda: comm.allreduce(np.ones(1000, np.float32)).tolist()[:2])
    large = outcome(lambda: comm.allreduce(np.ones(2**20, np.float32)))
    return {"small": small, "large": large}


# What each back end reports for a write the peer's memory key refuses, as a rank first
# notices it. ofi's tcp provider fails the write at the initiator, or closes the connection
# over it (FI_SHUTDOWN on both sides). Over verbs the writer's completion fails with
# IBV_WC_REM_ACCESS_ERR, and both QPs go to the error state: the target's posted receives
# are flushed.
BAD_KEY_MESSAGES = {
    "ofi": ("write failed", "FI_SHUTDOWN"),
    "ibverbs": ("remote access error", "Work Request Flushed Error"),
}


def test_bad_memory_key_is_refused(backend):
    """Clear-to-send entries naming a wrong key (WEFT_RDMA_FAULT=bad_key): eager messages
    still go, the payload writes are refused and both ranks get a PeerError within the
    timeout."""
    env = {**rdma_backends.env(backend), "WEFT_RDMA_FAULT": "bad_key"}
    env["WEFT_TUNE"] = "off"  # the tuner's probes at start-up would hit the fault first
    per_rank = lambda rank: {"WEFT_HOST_ID": f"weft-rdma-key-{rank}"}  # noqa: E731
    with Ranks(scenario_bad_key, 2, SHORT_TIMEOUT_S, env=env, env_per_rank=per_rank) as ranks:
        got = [ranks.result(r, timeout=SHORT_TIMEOUT_S + SLACK_S + 60) for r in range(2)]
    for rank, result in enumerate(got):
        assert result["small"].get("value") == [2.0, 2.0], f"rank {rank}: {result['small']}"
        large = result["large"]
        assert large["raised"] == "PeerError", f"rank {rank}: {large}"
        assert large["elapsed"] < SHORT_TIMEOUT_S + SLACK_S, f"rank {rank}: {large}"
    for rank, result in enumerate(got):
        message = result["large"]["message"]
        expected = BAD_KEY_MESSAGES[backend]
        assert any(e in message for e in expected), f"rank {rank}: {message}"


def scenario_leave_when_done(rank, size, store, timeout_s, rounds):
    """Communicators made one after another, each rank dropping its own (closing its
    connections) as soon as its barrier returns, while a slower rank may still be taking that
    barrier's last messages."""
    import numpy as np
    import weft

    def rounds_done():
        for i in range(rounds):
            comm = weft.Communicator(store, rank, size, name=f"leave{i}", timeout=timeout_s)
            comm.allreduce(np.ones(4, np.float32))
            comm.barrier()
            del comm
        return rounds

    return outcome(rounds_done)


def test_a_peer_that_leaves_when_done_fails_nobody(backend):
    """A peer's closed connection (FI_SHUTDOWN, the verbs goodbye) or a write it no longer
    takes (a credit for its last message) is an error only for a rank still waiting on that
    peer, after what the peer wrote before it left: a rank whose peers finished first still
    completes its call. (Over ofi's tcp provider ranks failed within a few rounds when the
    shutdown was an error at once.)"""
    env = {**rdma_backends.env(backend), "WEFT_TUNE": "off"}
    rounds = 20
    with Ranks(scenario_leave_when_done, 4, SHORT_TIMEOUT_S, rounds, env=env) as ranks:
        got = [ranks.result(r, timeout=SHORT_TIMEOUT_S * rounds + 60) for r in range(4)]
    for rank, result in enumerate(got):
        assert result.get("value") == rounds, f"rank {rank}: {result}"


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
def test_write_counts_follow_the_protocol(pools, backend, count):
    """Small messages go eagerly (no rendezvous write at all), large ones by rendezvous, where
    each ready-to-send of one rank meets one clear-to-send of the other and one payload write
    of its own; the receiver's other clear-to-send entries were early ones that an eager
    message left unused; a receiver returns its credits in the headers of the messages it sends
    back, and writes a Credit of its own at most once per message it received."""
    mine, theirs = pools.get(2, pool_name(backend)).run(case_count_writes, count)
    for me, peer in ((mine, theirs), (theirs, mine)):
        messages = me["eager"] + me["ready_to_send"]
        assert messages > 0, me
        if count == 1000:
            assert me["ready_to_send"] == me["payload"] == peer["clear_to_send"] == 0, (me, peer)
        else:
            assert me["ready_to_send"] > 0, me
            used = peer["clear_to_send"] - peer["unused_clear_to_send"]
            assert me["ready_to_send"] == used == me["payload"], (me, peer)
            assert peer["unused_clear_to_send"] <= peer["early_clear_to_send"], peer
        # The first barrier's messages, sent before the count began, may be credited in it.
        assert peer["credit"] <= messages + 2, (me, peer)


def case_late_root_broadcast(ctx, count, late_s):
    """A 2-rank tree broadcast of ``count`` floats whose root starts ``late_s`` late: whether the
    other rank got the root's data, and what each rank's connections wrote."""
    import time

    import numpy as np
    import weft

    comm = weft.Communicator(
        ctx.store, ctx.rank, ctx.size, name=ctx.fresh_name("tree"), timeout=60, algo="tree"
    )
    expected = np.arange(count, dtype=np.float32)
    buf = expected.copy() if ctx.rank == 0 else np.zeros(count, np.float32)
    comm.barrier()
    before = weft._C.rdma_writes()
    if ctx.rank == 0:
        time.sleep(late_s)
    comm.broadcast(buf, root=0)
    comm.barrier()
    after = weft._C.rdma_writes()
    wrote = {kind: after[kind] - before[kind] for kind in after}
    return {"right": bool(np.array_equal(buf, expected)), **wrote}


def test_a_receiving_step_clears_its_messages_before_they_are_asked_for(pools, backend):
    """A step that receives several messages into one span (4 MiB: four of the 1 MiB slots) says
    so as it begins (Connection::expect_receives), and its connection writes the clear-to-send
    entries of as many as it has slots at once, then one more as each comes: with the root 0.3 s
    late, every entry was written before its ready-to-send came, and every payload went right
    after its header. Receiving one message at a time, only the first entry was early."""
    root, leaf = pools.get(2, pool_name(backend)).run(case_late_root_broadcast, 2**20, 0.3)
    assert root["right"] and leaf["right"]
    assert root["ready_to_send"] >= 4, root
    assert root["ready_to_send"] == root["payload"] == leaf["clear_to_send"], (root, leaf)
    assert leaf["early_clear_to_send"] == leaf["clear_to_send"], leaf
    assert leaf["unused_clear_to_send"] == 0, leaf
