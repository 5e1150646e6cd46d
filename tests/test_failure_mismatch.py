"""Ranks that call different collectives (docs/failures.md#mismatched-calls), world size 4.

With WEFT_DEBUG_CHECKS=1, or torch's TORCH_DISTRIBUTED_DEBUG=DETAIL through torch.distributed,
every rank raises within 2 s an error listing each rank's (op, count, dtype, root, sequence
number), and the communicator stays usable. In the default mode every
mismatch (count 1000 against 1001, dtype, op, root, order), at a size of one message and of
many, over every algorithm family, ends in an error or in the right bytes: never a success
with wrong bytes. The same holds for reduce_scatter, allgather and alltoall (count, dtype),
reduce (count, root) and broadcast (count, dtype, root) over each of their families (chain
among them). The hier allreduce runs with ranks 0, 1 on one host identity and 2, 3 on another
(shm inside a host, tcp across); the debug checks are tried there too, and through torch's
DETAIL over shm and tcp. In debug mode a point-to-point receive of another type than was sent
fails naming both types, whether its message was set aside or arrived while it waited."""

from __future__ import annotations

import re
import time

import numpy as np
import pytest
from weft_proc import Ranks, outcome

ODD = 2  # the rank whose call differs
DEBUG_BOUND_S = 2.0
DEFAULT_TIMEOUT_S = 3.0
SMALL, LARGE = 1000, 300_000  # elements: one message, and many (slots are 256 KiB)


def calls(comm, case: str, count: int, odd: bool):
    """(call, check) pairs of one rank: ``check(results)`` says whether the bytes it ended
    with are right for the call it made, where that call succeeded."""
    size, rank = comm.size, comm.rank
    total = size * (size + 1) / 2
    if case == "count":
        buf = np.full(count + 1 if odd else count, rank + 1, np.float32)
        return [(lambda: comm.allreduce(buf), lambda: np.all(buf == total))]
    if case == "dtype":
        buf = np.full(count, rank + 1, np.int32 if odd else np.float32)
        return [(lambda: comm.allreduce(buf), lambda: np.all(buf == total))]
    if case == "op":
        buf = np.full(count, rank + 1, np.float32)
        if odd:
            return [(lambda: comm.broadcast(buf, root=0), lambda: np.all(buf == 1))]
        return [(lambda: comm.allreduce(buf), lambda: np.all(buf == total))]
    if case == "root":
        buf = np.full(count, rank + 1, np.float32)
        root = 1 if odd else 0
        return [(lambda: comm.broadcast(buf, root=root), lambda: np.all(buf == root + 1))]
    # order: two asynchronous calls, issued in the other order on the odd rank
    a = np.full(count, rank + 1, np.float32)
    a_in = a.copy()  # the allgather's input, kept alive until it completes
    g = np.zeros(count * size, np.float32)
    gathered = np.repeat(np.arange(1, size + 1, dtype=np.float32), count)
    pair = [
        (lambda: comm.allreduce(a, async_=True), lambda: np.all(a == total)),
        (lambda: comm.allgather(a_in, out=g, async_=True), lambda: np.all(g == gathered)),
    ]
    return pair[::-1] if odd else pair


CASES = ("count", "dtype", "op", "root", "order")


def other_calls(comm, case: str, count: int, odd: bool):
    """The mismatches of the other collectives: (call, check) pairs as ``calls`` gives."""
    size, rank = comm.size, comm.rank
    total = size * (size + 1) / 2
    n = count + 1 if odd and case.endswith("count") else count
    dtype = np.int32 if odd and case.endswith("dtype") else np.float32
    if case.startswith("reduce_scatter"):
        inp, out = np.full(n * size, rank + 1, dtype), np.zeros(n, dtype)
        return [(lambda: comm.reduce_scatter(inp, out=out), lambda: np.all(out == total))]
    if case.startswith("allgather"):
        inp, out = np.full(n, rank + 1, dtype), np.zeros(n * size, dtype)
        gathered = np.repeat(np.arange(1, size + 1), n)
        return [(lambda: comm.allgather(inp, out=out), lambda: np.array_equal(out, gathered))]
    if case.startswith("alltoall"):
        # Block p of rank r's input, for rank p, holds r * size + p + 1.
        inp = np.repeat(rank * size + np.arange(1, size + 1), n).astype(dtype)
        out = np.zeros(n * size, dtype)
        want = np.repeat(np.arange(size) * size + rank + 1, n)
        return [(lambda: comm.alltoall(inp, out), lambda: np.array_equal(out, want))]
    buf = np.full(n, rank + 1, dtype)
    if case.startswith("broadcast"):
        root = 1 if odd and case == "broadcast_root" else 0
        return [(lambda: comm.broadcast(buf, root=root), lambda: np.all(buf == root + 1))]
    root = 1 if odd and case == "reduce_root" else 0  # reduce_count, reduce_root
    # Only the root's result is defined; elsewhere the buffer is the rank's own input.
    want = total if rank == root else rank + 1
    return [(lambda: comm.reduce(buf, root=root), lambda: np.all(buf == want))]


# case: the collective whose families it runs over.
OTHER_CASES = {
    "reduce_scatter_count": "reduce_scatter",
    "reduce_scatter_dtype": "reduce_scatter",
    "reduce_count": "reduce",
    "reduce_root": "reduce",
    "allgather_count": "allgather",
    "allgather_dtype": "allgather",
    "alltoall_count": "alltoall",
    "alltoall_dtype": "alltoall",
    "broadcast_count": "broadcast",
    "broadcast_dtype": "broadcast",
    "broadcast_root": "broadcast",
}


def rank_env(transport: str, **env) -> tuple[dict, object]:
    """Ranks' ``env`` and ``env_per_rank`` for a transport: "shm", "tcp" (one host, forced), or
    "hosts-of-2": ranks 0, 1 on one host identity and 2, 3 on another (shm inside a host, tcp
    across), where the hier allreduce runs."""
    if transport == "hosts-of-2":
        return env, lambda rank: {"WEFT_HOST_ID": f"weft-mismatch-host-{rank // 2}"}
    return {"WEFT_TRANSPORT": transport, **env}, None


def run_calls(made) -> list[dict]:
    """Issues every call, then waits for each; what each raised, and whether its bytes are
    right where it succeeded."""
    infos = []
    handles = [outcome(call) for call, _ in made]
    for info, (_, check) in zip(handles, made, strict=True):
        if info["raised"] is None and hasattr(info["value"], "wait"):
            waited = outcome(info["value"].wait)
            info = {**waited, "elapsed": info["elapsed"] + waited["elapsed"]}
        info.pop("value", None)
        info["right"] = info["raised"] is not None or bool(check())
        infos.append(info)
    return infos


def typed_messages(rank: int, send, recv, barrier) -> list[dict]:
    """Point-to-point with a type mismatch: rank 0 sends rank 1 float32 elements three times
    (tag 7); rank 1 receives the first two as int32, the first set aside before its receive is
    posted and the second arriving while it waits, then the third as float32. ``send(array)``,
    ``recv(array)`` and ``barrier()`` make the calls; rank 1 returns what its receives did."""
    sent = np.arange(SMALL, dtype=np.float32)
    got = []
    if rank == 0:
        send(sent)
        time.sleep(0.6)  # rank 1 waits in its second receive by now
        send(sent)
        send(sent)
    elif rank == 1:
        time.sleep(0.3)  # the first message is set aside
        got = [outcome(lambda: recv(np.zeros(SMALL, np.int32))) for _ in range(2)]
        right = np.zeros(SMALL, np.float32)
        got.append(outcome(lambda: recv(right)))
        got[-1]["right"] = bool(np.array_equal(right, sent))
    barrier()  # rank 0's sends complete before rank 1 leaves
    return [{k: v for k, v in info.items() if k != "value"} for info in got]


def typed_problems(results, kind: str) -> list[str]:
    """Rank 1's receives of another type raised ``kind`` naming both types; the matching one
    took its message."""
    got = results[1]["typed"]
    problems = []
    for info in got[:2]:
        text = info.get("message") or ""
        if info["raised"] != kind or "float32 elements, but the receive takes int32" not in text:
            problems.append(f"a receive of another type: expected the debug check's {kind}: {info}")
    if got[2]["raised"] is not None or not got[2]["right"]:
        problems.append(f"the receive of the type sent: {got[2]}")
    return problems


def scenario_debug(rank, size, store, algo, cases):
    import weft

    comm = weft.Communicator(store, rank, size, name="debug", timeout=30, algo=algo)
    got = {}
    for case in cases:
        make = calls if case in CASES else other_calls
        got[case] = run_calls(make(comm, case, SMALL, rank == ODD))
    after = np.full(7, rank + 1, np.float32)
    used = outcome(lambda: comm.allreduce(after))
    got["usable"] = used["raised"] is None and bool(np.all(after == size * (size + 1) / 2))
    got["typed"] = typed_messages(rank, lambda a: comm.send(a, 1, tag=7),
                                  lambda a: comm.recv(a, 0, tag=7), comm.barrier)  # fmt: skip
    return got


DEBUG_CASES = (*CASES, *OTHER_CASES)


def debug_problems(results, kind: str) -> list[str]:
    """Every rank raised the debug check's ``kind`` of error in every case, within the bound,
    listing every rank's (op, count, dtype, root, sequence number); the group stayed usable."""
    problems = []
    for rank, got in enumerate(results):
        if not got["usable"]:
            problems.append(f"rank {rank}: an allreduce after the checks failed or was wrong")
        for case, infos in got.items():
            if case in ("usable", "typed"):
                continue
            for info in infos:
                message = info.get("message") or ""
                where = f"rank {rank}, {case}"
                if info["raised"] != kind or "WEFT_DEBUG_CHECKS" not in message:
                    problems.append(f"{where}: expected the debug check's {kind}: {info}")
                    continue
                if info["elapsed"] > DEBUG_BOUND_S:
                    problems.append(f"{where}: raised after {info['elapsed']:.1f} s")
                listed = re.findall(r"rank (\d): (\w+)\(count=(\d+), dtype=(\w+)", message)
                if sorted(int(r) for r, *_ in listed) != [0, 1, 2, 3]:
                    problems.append(f"{where}: does not list every rank's call: {message!r}")
                if "seq=" not in message or "root=" not in message:
                    problems.append(f"{where}: no root or sequence number: {message!r}")
    return problems


@pytest.mark.parametrize("transport", ["shm", "tcp", "hosts-of-2"])
def test_debug_checks_list_every_rank_call_on_every_rank(transport):
    env, per_rank = rank_env(transport, WEFT_TUNE="off", WEFT_DEBUG_CHECKS="1")
    algo = "hier" if transport == "hosts-of-2" else ""
    args = (algo, DEBUG_CASES)
    with Ranks(scenario_debug, 4, *args, env=env, env_per_rank=per_rank) as ranks:
        results = ranks.results(timeout=180)
    problems = debug_problems(results, "PeerError") + typed_problems(results, "InvalidArgument")
    assert not problems, "\n".join(problems)


def torch_calls(case: str, rank: int, size: int, odd: bool):
    """The same cases through torch.distributed (calls() has the core API's)."""
    import torch
    import torch.distributed as dist

    t = torch.full((SMALL,), float(rank + 1))
    if case == "count":
        return [lambda: dist.all_reduce(torch.ones(SMALL + 1) if odd else t)]
    if case == "dtype":
        return [lambda: dist.all_reduce(t.int() if odd else t)]
    if case == "op":
        return [lambda: dist.broadcast(t, 0) if odd else dist.all_reduce(t)]
    if case == "root":
        return [lambda: dist.broadcast(t, 1 if odd else 0)]
    gathered = [torch.zeros(SMALL) for _ in range(size)]
    pair = [
        lambda: dist.all_reduce(t, async_op=True),
        lambda: dist.all_gather(gathered, t.clone(), async_op=True),
    ]
    return pair[::-1] if odd else pair


def scenario_torch_detail(rank, size, store):
    """TORCH_DISTRIBUTED_DEBUG=DETAIL, WEFT_DEBUG_CHECKS unset: the calls through torch."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    import weft  # noqa: F401 - registers the backend

    dist.init_process_group(
        "weft", store=store, rank=rank, world_size=size, timeout=timedelta(seconds=30)
    )
    got = {}
    for case in CASES:
        made = [(call, lambda: True) for call in torch_calls(case, rank, size, rank == ODD)]
        got[case] = run_calls(made)
    after = torch.full((7,), float(rank + 1))
    dist.all_reduce(after)
    got["usable"] = bool(torch.all(after == size * (size + 1) / 2))
    got["typed"] = typed_messages(
        rank,
        lambda a: dist.send(torch.from_numpy(a), 1, tag=7),
        lambda a: dist.recv(torch.from_numpy(a), 0, tag=7),
        dist.barrier,
    )
    dist.destroy_process_group()
    return got


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_torch_detail_debug_turns_on_the_checks_through_torch(transport):
    """Under torch's DETAIL, init_process_group("weft") works (torch's ProcessGroupWrapper is
    not put around weft's groups) and weft's checks list every rank's call."""
    env, per_rank = rank_env(transport, TORCH_DISTRIBUTED_DEBUG="DETAIL", WEFT_TUNE="off")
    with Ranks(scenario_torch_detail, 4, env=env, env_per_rank=per_rank) as ranks:
        results = ranks.results(timeout=180)
    problems = debug_problems(results, "DistBackendError")
    problems += typed_problems(results, "ValueError")  # torch raises InvalidArgument so
    assert not problems, "\n".join(problems)


def scenario_default(rank, size, store, runs):
    """``runs``: (family, case) pairs, each at both counts on a communicator of its own."""
    import weft

    got = []
    for family, case in runs:
        for count in (SMALL, LARGE):
            name = f"mismatch-{family or 'default'}-{count}-{case}"
            start = time.monotonic()
            comm = weft.Communicator(
                store, rank, size, name=name, timeout=DEFAULT_TIMEOUT_S, algo=family
            )
            # The family the communicator uses: the one forced, unless weft chose another.
            collective = "allreduce" if case in CASES else OTHER_CASES[case]
            chosen = comm.algorithm(collective, count * 4)[0] if family else family
            make = calls if case in CASES else other_calls
            infos = run_calls(make(comm, case, count, rank == ODD))
            for info in infos:
                info.update(case=name, total=time.monotonic() - start, family=family, chosen=chosen)
            got += infos
            del comm
    return got


def default_runs(transport: str) -> list[tuple[str, str]]:
    """(family, case) pairs: every family on one host over shm and tcp (alltoall, which has
    one algorithm, under its default), and on two hosts the families that need them."""
    import weft

    if transport == "hosts-of-2":
        one_host = weft.algorithms("allreduce")
        several = [f for f in weft.algorithms("allreduce", 2) if f not in one_host]
        return [(family, case) for family in several for case in CASES]
    runs = [(family, case) for family in weft.algorithms("allreduce") for case in CASES]
    for case, collective in OTHER_CASES.items():
        runs += [(family, case) for family in weft.algorithms(collective) or [""]]
    return runs


@pytest.mark.parametrize("transport", ["shm", "tcp", "hosts-of-2"])
def test_default_mode_never_succeeds_with_wrong_bytes(transport):
    runs = default_runs(transport)
    assert runs, f"no algorithm family to run over {transport}"
    env, per_rank = rank_env(transport, WEFT_TUNE="off")
    with Ranks(scenario_default, 4, runs, env=env, env_per_rank=per_rank) as ranks:
        results = ranks.results(timeout=900)
    problems = []
    for rank, infos in enumerate(results):
        for info in infos:
            if not info["right"]:
                problems.append(f"rank {rank}, {info['case']}: succeeded with wrong bytes")
            elif info["raised"] and "Error" not in info["mro"]:
                problems.append(f"rank {rank}, {info['case']}: not a weft error: {info}")
            if info["chosen"] != info["family"]:
                problems.append(f"rank {rank}, {info['case']}: ran {info['chosen']} instead")
            if info["total"] > DEFAULT_TIMEOUT_S + 5:
                problems.append(f"rank {rank}, {info['case']}: took {info['total']:.1f} s")
    assert not problems, "\n".join(problems)
