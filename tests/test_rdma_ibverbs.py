"""weft's ibverbs back end over the verbs emulator (tests/verbs_emulator/): two queue pairs per
peer, each fault the emulator injects (device, port and QP async events among them) and a wrong
memory key turned into the documented error, WEFT_IB_TIMEOUT and WEFT_IB_RETRY_CNT reaching
every queue pair, a missing library, no device and a WEFT_IB_HCA naming no device refused with
one clear error, auto picking ibverbs between hosts (and shm on one), and one small run on real
hardware where libibverbs lists a device. tests/test_rdma.py runs the collective matrix over
it; tests/test_errors.py kills a peer mid-transfer."""

from __future__ import annotations

import contextlib
import ctypes
import json

import pytest
import rdma_backends
from test_collectives import COLLECTIVES
from test_errors import SHORT_TIMEOUT_S, SLACK_S
from test_rdma import PATH_COUNTS, SOME_OPS, TWO_DTYPES
from weft_proc import Ranks, outcome
from weft_ref import assert_no_mismatch

MISSING = rdma_backends.missing("ibverbs")
needs_emulator = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")


def scenario_allreduces(rank, size, store, timeout_s):
    """A communicator, then a small (eager) and a large (rendezvous) allreduce."""
    import numpy as np
    import weft

    def run():
        comm = weft.Communicator(store, rank, size, timeout=timeout_s)
        transports = [comm.transport_to(p) for p in range(size)]
        small = comm.allreduce(np.ones(1000, np.float32))
        large = comm.allreduce(np.full(2**20 + 3, rank + 1, np.float32))
        return {"transports": transports, "small": float(small[0]), "large": float(large[-1])}

    return outcome(run)


def scenario_loop(rank, size, store, timeout_s):
    """A communicator, then allreduces of 256 KiB (rendezvous) until one fails (or 20 s). Once
    the communicator exists, ``elapsed`` counts from the start of the call that failed: its
    creation, which takes seconds while every world of the module starts at once, is no part of
    the bound on an error's arrival."""
    import time

    import numpy as np
    import weft

    buf = np.ones(2**16, np.float32)
    done = 0
    call_started = None

    def loop():
        nonlocal done, call_started
        comm = weft.Communicator(store, rank, size, timeout=timeout_s)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            call_started = time.monotonic()
            comm.allreduce(buf)
            done += 1

    began = time.monotonic()
    info = outcome(loop)
    if call_started is not None:
        info["elapsed"] = began + info["elapsed"] - call_started
    return {**info, "completed": done}


def run_worlds(worlds: dict[str, tuple]) -> dict[str, list[dict]]:
    """Runs every world at once (name: scenario, size, environment of every rank, environments
    by rank, then any arguments of the scenario after its timeout), one host identity per rank
    unless given; the outcomes of each world's ranks."""
    got = {}
    with contextlib.ExitStack() as stack:
        started = {}
        for name, (scenario, size, env, by_rank, *args) in worlds.items():
            per_rank = lambda r, n=name, b=by_rank: {"WEFT_HOST_ID": f"{n}-{r}", **b.get(r, {})}  # noqa: E731
            ranks = Ranks(scenario, size, SHORT_TIMEOUT_S, *args, env=env, env_per_rank=per_rank)
            started[name] = stack.enter_context(ranks)
        for name, ranks in started.items():
            size = worlds[name][1]
            got[name] = [
                ranks.result(r, timeout=SHORT_TIMEOUT_S + SLACK_S + 90) for r in range(size)
            ]
    return got


def emulated(**extra: str) -> dict[str, str]:
    """The environment of a rank on the verbs emulator, the tuner off (its probes at start-up
    would meet the faults first)."""
    return {**rdma_backends.env("ibverbs"), "WEFT_TUNE": "off", **extra}


def fault(spec: str) -> dict[str, str]:
    return {"WEFT_VERBS_EMU_FAULT": spec}


QP_EVENTS = {  # the emulator's fault: what libibverbs calls the event
    "qp_fatal": "local work queue catastrophic error",
    "qp_req_err": "invalid request local work queue error",
    "qp_access_err": "local access violation work queue error",
}


def worlds(stats_dir) -> dict[str, tuple]:
    """name: (scenario, size, environment of every rank, environments by rank)."""
    return {
        "retry_exceeded": (scenario_loop, 2, emulated(), {0: fault("retry_exceeded:40")}),
        "cq_overflow": (scenario_loop, 2, emulated(**fault("cq_overflow:2")), {}),
        "device_fatal": (scenario_loop, 2, emulated(**fault("device_fatal:1000")), {}),
        "port_err": (scenario_loop, 2, emulated(**fault("port_err:1000")), {}),
        **{name: (scenario_loop, 2, emulated(), {0: fault(f"{name}:1000")}) for name in QP_EVENTS},
        "ib_timeout_and_retry_cnt": (
            scenario_allreduces,
            2,
            emulated(
                WEFT_IB_TIMEOUT="14",
                WEFT_IB_RETRY_CNT="3",
                WEFT_VERBS_EMU_STATS=str(stats_dir / "set"),
            ),
            {},
        ),
        "rnr": (scenario_loop, 2, emulated(), {1: fault("rnr")}),
        "no_device": (scenario_allreduces, 2, emulated(**fault("no_device")), {}),
        "missing_library": (
            scenario_allreduces,
            2,
            emulated(WEFT_IBVERBS_LIB="/nonexistent/libibverbs.so.1"),
            {},
        ),
        "hca_missing": (scenario_allreduces, 2, emulated(WEFT_IB_HCA="=mlx5_0"), {}),
        "qps_differ": (scenario_allreduces, 2, emulated(), {0: {"WEFT_IB_QPS_PER_PEER": "2"}}),
        # with a device, port and GID index named
        "auto_between_hosts": (
            scenario_allreduces,
            2,
            emulated(
                WEFT_TRANSPORT="auto",
                WEFT_IB_HCA="=weft_emu0:1",
                WEFT_IB_GID_INDEX="3",
                WEFT_VERBS_EMU_STATS=str(stats_dir / "default"),
            ),
            {},
        ),
        "auto_one_host": (
            scenario_allreduces,
            2,
            emulated(WEFT_TRANSPORT="auto"),
            {0: {"WEFT_HOST_ID": "one-host"}, 1: {"WEFT_HOST_ID": "one-host"}},
        ),
        "auto_no_device": (
            scenario_allreduces,
            2,
            emulated(WEFT_TRANSPORT="auto", **fault("no_device")),
            {},
        ),
    }


@pytest.fixture(scope="module")
def stats_dir(tmp_path_factory):
    """Where the emulator's counters go: one folder per world that keeps them."""
    base = tmp_path_factory.mktemp("verbs_emu_stats")
    for world in ("set", "default"):
        (base / world).mkdir()
    return base


@pytest.fixture(scope="module")
def outcomes(stats_dir):
    """Every world of worlds(), run at once: the outcomes of each world's ranks."""
    return run_worlds(worlds(stats_dir))


def expect(outs, raised: str, *texts: str, within_s: float = SHORT_TIMEOUT_S + SLACK_S):
    """Every rank raised ``raised`` within ``within_s``, its message naming one of ``texts``."""
    for rank, got in enumerate(outs):
        assert got["raised"] == raised, f"rank {rank}: {got}"
        assert got["elapsed"] < within_s, f"rank {rank}: {got}"
        assert any(t in got["message"] for t in texts), f"rank {rank}: {got['message']}"


def expect_values(outs, transport: str):
    """Every rank's allreduces right (scenario_allreduces), each peer reached by ``transport``."""
    size = len(outs)
    for rank, got in enumerate(outs):
        assert got["raised"] is None, f"rank {rank}: {got}"
        want = ["self" if p == rank else transport for p in range(size)]
        assert got["value"]["transports"] == want, f"rank {rank}: {got}"
        assert got["value"]["small"] == size, f"rank {rank}: {got}"
        assert got["value"]["large"] == size * (size + 1) / 2, f"rank {rank}: {got}"


@needs_emulator
def test_retry_exceeded(outcomes):
    """A write that exhausts its retries fails the writer with IBV_WC_RETRY_EXC_ERR; its peer,
    whose QP saw nothing (as on a NIC), times out naming the writer's error."""
    writer, peer = outcomes["retry_exceeded"]
    expect([writer], "PeerError", "transport retry counter exceeded")
    assert peer["raised"] in ("PeerError", "TimeoutError"), peer
    assert peer["elapsed"] < SHORT_TIMEOUT_S + SLACK_S, peer
    assert "transport retry counter exceeded" in peer["message"], peer


@needs_emulator
def test_cq_overflow(outcomes):
    """A CQ that overflows (IBV_EVENT_CQ_ERR) fails its rank; the peer hears the goodbye its
    connection writes as it closes."""
    expect(outcomes["cq_overflow"], "PeerError", "CQ error")


@needs_emulator
def test_device_fatal(outcomes):
    """IBV_EVENT_DEVICE_FATAL fails every connection of the device."""
    expect(outcomes["device_fatal"], "PeerError", "local catastrophic error")


@needs_emulator
def test_port_error(outcomes):
    """IBV_EVENT_PORT_ERR fails every connection of the port, naming the port."""
    expect(outcomes["port_err"], "PeerError", "port error on port 1")


@needs_emulator
@pytest.mark.parametrize("event", QP_EVENTS)
def test_qp_events(outcomes, event):
    """A fatal event on one QP (its QP to ERR) fails the rank that got it, naming the event
    and the QP; its peer, whose writes to that QP are no longer acknowledged, fails too."""
    hit, peer = outcomes[event]
    expect([hit], "PeerError", f"async event {QP_EVENTS[event]} on QP ")
    assert peer["raised"] in ("PeerError", "TimeoutError"), peer
    assert peer["elapsed"] < SHORT_TIMEOUT_S + SLACK_S, peer


@needs_emulator
def test_ib_timeout_and_retry_cnt_reach_the_queue_pairs(outcomes, stats_dir):
    """WEFT_IB_TIMEOUT and WEFT_IB_RETRY_CNT are what every QP enters RTS with (the emulator
    records them), NCCL's 20 and 7 when unset; the job computes as before."""
    expect_values(outcomes["ib_timeout_and_retry_cnt"], "ibverbs")
    for world, (timeout, retry_cnt) in {"set": (14, 3), "default": (20, 7)}.items():
        stats = [json.loads(p.read_text()) for p in (stats_dir / world).glob("verbs_emu.*.json")]
        assert len(stats) == 2, stats
        for s in stats:
            assert s["rts_timeouts_mask"] == 1 << timeout, s
            assert s["rts_retry_cnts_mask"] == 1 << retry_cnt, s


@needs_emulator
def test_receiver_not_ready(outcomes):
    """A peer that never takes a receive: the writes are retried for ever (rnr_retry 7, as
    NCCL sets it) and both ranks time out."""
    expect(outcomes["rnr"], "TimeoutError", "nothing arrived")


@needs_emulator
def test_no_device(outcomes):
    expect(outcomes["no_device"], "InvalidArgument", "lists no device")


@needs_emulator
def test_missing_library(outcomes):
    expect(
        outcomes["missing_library"],
        "InvalidArgument",
        "WEFT_TRANSPORT=ibverbs: /nonexistent/libibverbs.so.1 could not be loaded (",
    )


@needs_emulator
def test_hca_naming_no_device(outcomes):
    expect(outcomes["hca_missing"], "InvalidArgument", "WEFT_IB_HCA='=mlx5_0' allows")


@needs_emulator
def test_queue_pairs_differ(outcomes):
    expect(outcomes["qps_differ"], "InvalidArgument", "WEFT_IB_QPS_PER_PEER")


@needs_emulator
def test_auto_takes_ibverbs_between_hosts(outcomes):
    """Between hosts auto takes ibverbs, here on the port and GID index named by WEFT_IB_HCA and
    WEFT_IB_GID_INDEX."""
    expect_values(outcomes["auto_between_hosts"], "ibverbs")


@needs_emulator
def test_auto_takes_shm_on_one_host(outcomes):
    expect_values(outcomes["auto_one_host"], "shm")


@needs_emulator
def test_auto_without_a_device_takes_tcp(outcomes):
    expect_values(outcomes["auto_no_device"], "tcp")


@needs_emulator
@pytest.mark.parametrize("collective", list(COLLECTIVES))
def test_two_queue_pairs_per_peer(pools, collective):
    """WEFT_IB_QPS_PER_PEER=2: writes spread over two QPs land in any order between them."""
    pool = pools.get(3, "ibverbs-2qps")
    assert_no_mismatch(pool.run(COLLECTIVES[collective], TWO_DTYPES, SOME_OPS, PATH_COUNTS))


def real_device_missing() -> str | None:
    """None when the system's libibverbs lists an RDMA device, else why not."""
    try:
        lib = ctypes.CDLL("libibverbs.so.1")
    except OSError as e:
        return f"libibverbs is not installed ({e})"
    lib.ibv_get_device_list.restype = ctypes.c_void_p
    count = ctypes.c_int(0)
    devices = lib.ibv_get_device_list(ctypes.byref(count))
    if devices:
        lib.ibv_free_device_list(ctypes.c_void_p(devices))
    return None if count.value > 0 else "no RDMA device: libibverbs lists none here"


REAL_MISSING = real_device_missing()


@pytest.mark.skipif(REAL_MISSING is not None, reason=REAL_MISSING or "")
def test_real_device():
    """Two ranks over the machine's own RDMA device (loopback through the NIC)."""
    env = {"WEFT_TRANSPORT": "ibverbs"}
    outs = run_worlds({"real": (scenario_allreduces, 2, env, {})})["real"]
    expect_values(outs, "ibverbs")
