"""The registration cache over the verbs emulator (tests/verbs_emulator/): with On-Demand Paging
(WEFT_VERBS_EMU_ODP=1) a buffer reduced every call is registered once, without it once per
call; a buffer unmapped and mapped again at its address is reduced right either way; a device
whose ODP does not cover RC writes registers without it; and WEFT_IB_ODP=1 where ODP cannot be
used is refused with one clear error. The emulator counts ibv_reg_mr and ibv_dereg_mr calls
(WEFT_VERBS_EMU_STATS)."""

from __future__ import annotations

import json

import pytest
from test_rdma_ibverbs import emulated, expect, needs_emulator, run_worlds, scenario_allreduces

MIB = 1 << 20
SLICE = 256 << 10
MAP_FIXED = 0x10  # Linux; Python's mmap module does not name it


def scenario_same_buffer(rank, size, store, timeout_s, calls):
    """A communicator, then ``calls`` allreduces in place of one 1 MiB buffer (rendezvous
    messages, each registered), which after the first call is unmapped and mapped again at the
    same address (MAP_FIXED), as when a buffer is freed and the next one allocated where it
    was. Returns the calls whose result was wrong and this process's id."""
    import ctypes
    import mmap
    import os

    import numpy as np
    import weft
    from weft_proc import outcome

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]  # fmt: skip
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    prot = mmap.PROT_READ | mmap.PROT_WRITE
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS

    def mapped(where, extra_flags):
        got = libc.mmap(where, MIB, prot, flags | extra_flags, -1, 0)
        if got in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap failed")
        return got

    address = mapped(None, 0)

    def run():
        comm = weft.Communicator(store, rank, size, timeout=timeout_s)
        wrong = []
        for call in range(calls):
            if call == 1:
                libc.munmap(address, MIB)
                assert mapped(address, MAP_FIXED) == address
            buf = np.ctypeslib.as_array((ctypes.c_float * (MIB // 4)).from_address(address))
            buf[:] = (rank + 1) * (call + 1)
            comm.allreduce(buf)
            if not (buf == size * (size + 1) // 2 * (call + 1)).all():
                wrong.append(call)
        return {"wrong": wrong, "pid": os.getpid()}

    return outcome(run)


def scenario_many_buffers(rank, size, store, timeout_s, buffers):
    """A communicator, then an allreduce in place of each of ``buffers`` 256 KiB slices of one
    array (rendezvous messages), every one registered anew: no slice covers another. Returns
    the slices whose result was wrong and this process's id."""
    import os

    import numpy as np
    import weft
    from weft_proc import outcome

    def run():
        comm = weft.Communicator(store, rank, size, timeout=timeout_s)
        whole = np.full((buffers, SLICE // 4), rank + 1, np.float32)
        for i in range(buffers):
            comm.allreduce(whole[i])
        wrong = np.flatnonzero((whole != size * (size + 1) // 2).any(1))
        return {"wrong": wrong.tolist(), "pid": os.getpid()}

    return outcome(run)


ODP = {"WEFT_VERBS_EMU_ODP": "1"}
MAX_IDLE = 64  # RegistrationCache's bound on idle registrations, per connection
# Registrations a connection holds besides idle ones, at most: its own buffers, and those of
# the rendezvous messages in flight (4 sends, the default WEFT_TCP_SLOTS, and one receive).
HELD = 1 + 4 + 1


@pytest.fixture(scope="module")
def stats_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("verbs_emu_registration")


@pytest.fixture(scope="module")
def outcomes(stats_dir):
    """Each world of two ranks, run at once: name: the outcomes of its ranks."""
    worlds = {}
    for odp, emulator in (("odp", ODP), ("pinned", {})):
        for calls in (2, 20):
            stats = stats_dir / f"{odp}_{calls}"
            stats.mkdir()
            env = emulated(**emulator, WEFT_VERBS_EMU_STATS=str(stats))
            worlds[f"{odp}_{calls}"] = (scenario_same_buffer, 2, env, {}, calls)
    (stats_dir / "odp_many").mkdir()
    env = emulated(**ODP, WEFT_CHANNELS="1", WEFT_VERBS_EMU_STATS=str(stats_dir / "odp_many"))
    worlds["odp_many"] = (scenario_many_buffers, 2, env, {}, 100)
    worlds["odp_required"] = (scenario_allreduces, 2, emulated(WEFT_IB_ODP="1"), {})
    no_rc_write = {"WEFT_VERBS_EMU_ODP": "no_rc_write"}
    (stats_dir / "no_rc_write").mkdir()
    env = emulated(**no_rc_write, WEFT_VERBS_EMU_STATS=str(stats_dir / "no_rc_write"))
    worlds["no_rc_write"] = (scenario_same_buffer, 2, env, {}, 2)
    env = emulated(**no_rc_write, WEFT_IB_ODP="1")
    worlds["no_rc_write_required"] = (scenario_allreduces, 2, env, {})
    worlds["odp_bad_value"] = (scenario_allreduces, 2, emulated(WEFT_IB_ODP="yes"), {})
    return run_worlds(worlds)


def registrations(outcomes, stats_dir, world: str) -> list[dict]:
    """Each rank's emulator counters in ``world``, every call's result checked first."""
    got = []
    for rank, out in enumerate(outcomes[world]):
        assert out["raised"] is None, f"{world} rank {rank}: {out}"
        assert out["value"]["wrong"] == [], f"{world} rank {rank}: {out}"
        path = stats_dir / world / f"verbs_emu.{out['value']['pid']}.json"
        got.append(json.loads(path.read_text()))
    return got


@needs_emulator
def test_odp_registers_a_reused_buffer_once(outcomes, stats_dir):
    """With ODP every registration is an ODP one, and 20 calls make exactly as many as 2 (the
    connections' own buffers, the probe and the first call's messages): the buffer's
    registrations are kept and reused, also after it was unmapped and mapped again. All go at
    the end."""
    for few, many in zip(
        registrations(outcomes, stats_dir, "odp_2"), registrations(outcomes, stats_dir, "odp_20")
    ):
        assert many["reg_mrs"] == few["reg_mrs"], (few, many)
        assert many["reg_mrs"] < 20, many
        for s in (few, many):
            assert s["reg_mrs_on_demand"] == s["reg_mrs"] == s["dereg_mrs"], s


@needs_emulator
def test_odp_keeps_a_bounded_number_idle(outcomes, stats_dir):
    """100 buffers reduced once each over one connection make at least a registration each,
    but the cache keeps at most 64 idle: the least recently used go as new ones come, so the
    most registered at once stays within the bound and what the connection holds besides."""
    for s in registrations(outcomes, stats_dir, "odp_many"):
        assert s["reg_mrs"] >= 100, s
        assert s["mrs_peak"] <= MAX_IDLE + HELD, s
        assert s["reg_mrs"] == s["dereg_mrs"], s


@needs_emulator
def test_without_odp_each_call_registers_again(outcomes, stats_dir):
    """Without ODP (the emulator refuses IBV_ACCESS_ON_DEMAND, so auto turns it off) a
    registration pins pages and would outlive a buffer freed and mapped anew: weft registers
    each message's buffer again once the last one using it let go. 18 more calls make at least
    9 more registrations (ODP's make none): a message may still take the registration of the
    previous call's message of the same range when that one's completion has not been seen
    yet, which is how one run here made 17."""
    for few, many in zip(
        registrations(outcomes, stats_dir, "pinned_2"),
        registrations(outcomes, stats_dir, "pinned_20"),
    ):
        assert many["reg_mrs"] - few["reg_mrs"] >= 9, (few, many)
        for s in (few, many):
            assert s["reg_mrs_on_demand"] == 0, s
            assert s["reg_mrs"] == s["dereg_mrs"], s


@needs_emulator
def test_odp_required_without_it_is_refused(outcomes):
    expect(
        outcomes["odp_required"],
        "InvalidArgument",
        "WEFT_IB_ODP=1, but On-Demand Paging cannot be used: the device reports no ODP; unset "
        "WEFT_IB_ODP or set it to auto or 0",
    )


@needs_emulator
def test_odp_that_does_not_cover_rc_writes_is_not_used(outcomes, stats_dir):
    """A device whose ODP covers RC sends but not RDMA writes (ibv_query_device_ex's
    rc_odp_caps, though its ibv_reg_mr takes IBV_ACCESS_ON_DEMAND): auto registers without it,
    and WEFT_IB_ODP=1 is refused naming what is missing."""
    for s in registrations(outcomes, stats_dir, "no_rc_write"):
        assert s["reg_mrs"] > 0 and s["reg_mrs_on_demand"] == 0, s
    expect(
        outcomes["no_rc_write_required"],
        "InvalidArgument",
        "On-Demand Paging cannot be used: the device's ODP does not cover RDMA writes on RC "
        "queue pairs (rc_odp_caps 0xb)",
    )


@needs_emulator
def test_odp_setting_is_checked(outcomes):
    expect(outcomes["odp_bad_value"], "InvalidArgument", "WEFT_IB_ODP='yes': use auto, 0 or 1")
