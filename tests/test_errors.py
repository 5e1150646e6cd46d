"""Errors: bad arguments are refused before any byte moves, with the right exception class and
a message that says what is wrong; timeouts, dead peers and mismatched worlds turn into errors
on every rank within the timeout, leaving no process and no shared-memory file behind."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import rdma_backends
from weft_proc import Ranks, mark, outcome, processes_with_token
from weft_ref import Checker, assert_no_mismatch, is_invalid_argument

SHORT_TIMEOUT_S = 10.0
SLACK_S = 5.0  # the spec: errors arrive within timeout + 5 s


def weft_error_classes():
    import weft

    return {
        name: getattr(weft, name, None)
        for name in ("Error", "InvalidArgument", "PeerError", "TimeoutError", "AbortedError")
    }


def test_exception_hierarchy():
    classes = weft_error_classes()
    missing = [name for name, cls in classes.items() if cls is None]
    assert not missing, f"weft does not export {missing}"
    assert issubclass(classes["InvalidArgument"], ValueError)
    for name, cls in classes.items():
        assert issubclass(cls, classes["Error"]), f"weft.{name} is not a weft.Error"
        assert issubclass(cls, Exception)


# ---- bad arguments, in a live pool ----------------------------------------------------------

READ_ONLY = r"read.?only|writ"
DTYPE = r"dtype|data ?type|unsupported"
MISMATCH = r"dtype|data ?type|match"
TOO_SMALL = r"small|size|count|element|length|short"
CONTIGUOUS = r"contiguous"
OVERLAP = r"overlap"


def zeros(n, dtype=np.float32):
    return np.zeros(n, dtype)


def readonly(n):
    a = np.zeros(n, np.float32)
    a.flags.writeable = False
    return a


def strided(n):
    return np.zeros(2 * n, np.float32)[::2]


def with_buffer(n, use):
    """``use`` of one fresh buffer of ``n`` elements (to pass views of it as input and output)."""
    return use(zeros(n))


def shifted(call, **kwargs):
    """``call`` with an out that is its input moved by one element: they overlap."""
    buf = zeros(9)
    return call(buf[:8], out=buf[1:], **kwargs)


def bad_calls(comm, rank: int, n: int) -> list[tuple]:
    """[(description, call, regex the message must match)], the same on every rank."""
    import torch

    def t(dtype, count=8):
        return torch.zeros(count, dtype=getattr(torch, dtype))

    calls = [
        ("allreduce of a read-only array", lambda: comm.allreduce(readonly(8)), READ_ONLY),
        (
            "allreduce into a read-only out",
            lambda: comm.allreduce(zeros(8), out=readonly(8)),
            READ_ONLY,
        ),
        ("broadcast of a read-only array", lambda: comm.broadcast(readonly(8)), READ_ONLY),
        ("reduce of a read-only array", lambda: comm.reduce(readonly(8), root=0), READ_ONLY),
        (
            "allgather into a read-only out",
            lambda: comm.allgather(zeros(4), out=readonly(4 * n)),
            READ_ONLY,
        ),
        (
            "recv into a read-only array",
            lambda: comm.recv(readonly(8), peer=(rank + 1) % n),
            READ_ONLY,
        ),
        (
            "allreduce float32 -> float64 out",
            lambda: comm.allreduce(zeros(8), out=zeros(8, np.float64)),
            MISMATCH,
        ),
        (
            "allgather float32 -> int32 out",
            lambda: comm.allgather(zeros(4), out=zeros(4 * n, np.int32)),
            MISMATCH,
        ),
        (
            "reduce_scatter float32 -> float64 out",
            lambda: comm.reduce_scatter(zeros(4 * n), out=zeros(4, np.float64)),
            MISMATCH,
        ),
        (
            "reduce float32 -> float16 out",
            lambda: comm.reduce(zeros(8), root=0, out=zeros(8, np.float16)),
            MISMATCH,
        ),
        (
            "alltoall float32 -> float64 out",
            lambda: comm.alltoall(zeros(4 * n), zeros(4 * n, np.float64)),
            MISMATCH,
        ),
        (
            "allreduce torch bfloat16 -> float16 out",
            lambda: comm.allreduce(t("bfloat16"), out=t("float16")),
            MISMATCH,
        ),
        ("allreduce out too small", lambda: comm.allreduce(zeros(8), out=zeros(7)), TOO_SMALL),
        (
            "allgather out too small",
            lambda: comm.allgather(zeros(4), out=zeros(4 * n - 1)),
            TOO_SMALL,
        ),
        (
            "reduce_scatter out too small",
            lambda: comm.reduce_scatter(zeros(4 * n), out=zeros(3)),
            TOO_SMALL,
        ),
        ("reduce out too small", lambda: comm.reduce(zeros(8), root=0, out=zeros(7)), TOO_SMALL),
        (
            "alltoall out too small",
            lambda: comm.alltoall(zeros(4 * n), zeros(4 * n - 1)),
            TOO_SMALL,
        ),
        (
            "alltoall send_counts beyond buf",
            lambda: comm.alltoall(zeros(n), zeros(2 * n), send_counts=[2] * n, recv_counts=[2] * n),
            TOO_SMALL,
        ),
        (
            "alltoall with size+1 counts",
            lambda: comm.alltoall(
                zeros(n + 1), zeros(n + 1), send_counts=[1] * (n + 1), recv_counts=[1] * (n + 1)
            ),
            r"count|size",
        ),
        (
            "reduce_scatter out=None, len not divisible by size",
            lambda: comm.reduce_scatter(zeros(4 * n + 1)),
            r"divisib|multiple",
        ),
        ("allreduce of a strided numpy view", lambda: comm.allreduce(strided(8)), CONTIGUOUS),
        (
            "allreduce of a Fortran-order 2-D array",
            lambda: comm.allreduce(np.zeros((4, 3), np.float32, order="F")),
            CONTIGUOUS,
        ),
        (
            "allreduce of a transposed torch tensor",
            lambda: comm.allreduce(torch.zeros(4, 3).t()),
            CONTIGUOUS,
        ),
        (
            "allreduce into a strided out",
            lambda: comm.allreduce(zeros(8), out=strided(8)),
            CONTIGUOUS,
        ),
        ("allgather of a strided numpy view", lambda: comm.allgather(strided(8)), CONTIGUOUS),
        ("allreduce into its input moved by one", lambda: shifted(comm.allreduce), OVERLAP),
        ("reduce into its input moved by one", lambda: shifted(comm.reduce, root=0), OVERLAP),
        (
            "reduce_scatter into buf off the in-place layout",
            lambda: with_buffer(4 * n + 1, lambda b: comm.reduce_scatter(b[:-1], out=b[1:5])),
            OVERLAP,
        ),
        (
            "allgather from out off the in-place layout",
            lambda: with_buffer(4 * n + 1, lambda o: comm.allgather(o[1:5], out=o[:-1])),
            OVERLAP,
        ),
        ("alltoall in place", lambda: with_buffer(4 * n, lambda b: comm.alltoall(b, b)), OVERLAP),
        ("allreduce with op='bogus'", lambda: comm.allreduce(zeros(8), op="bogus"), r"bogus|op"),
        ("broadcast with root=size", lambda: comm.broadcast(zeros(8), root=n), r"root|rank"),
        ("reduce with root=size", lambda: comm.reduce(zeros(8), root=n), r"root|rank"),
        ("send to peer=size", lambda: comm.send(zeros(8), n), r"peer|rank"),
        ("recv from peer=size", lambda: comm.recv(zeros(8), peer=n), r"peer|rank"),
    ]
    for dtype in ("complex64", "bool", "uint16"):
        pattern = f"{DTYPE}|{dtype}"
        calls.append(
            (f"allreduce of numpy {dtype}", lambda d=dtype: comm.allreduce(zeros(8, d)), pattern)
        )
        calls.append(
            (f"broadcast of numpy {dtype}", lambda d=dtype: comm.broadcast(zeros(8, d)), pattern)
        )
    for dtype in ("complex64", "bool"):
        calls.append(
            (
                f"allreduce of torch {dtype}",
                lambda d=dtype: comm.allreduce(t(d)),
                f"{DTYPE}|{dtype}",
            )
        )
    return calls


def root_only_bad_calls(comm, n: int) -> list[tuple]:
    """Bad only at the root (0): the other ranks must not make the call at all."""
    return [
        (
            "gather out too small (at root)",
            lambda: comm.gather(zeros(4), root=0, out=zeros(4 * n - 1)),
            TOO_SMALL,
        ),
        (
            "scatter buf too small (at root)",
            lambda: comm.scatter(zeros(4), root=0, buf=zeros(4 * n - 1)),
            TOO_SMALL,
        ),
        (
            "gather into out holding buf (at root)",
            lambda: with_buffer(4 * n, lambda o: comm.gather(o[4:8], root=0, out=o)),
            OVERLAP,
        ),
        (
            "scatter from buf holding out (at root)",
            lambda: with_buffer(4 * n, lambda b: comm.scatter(b[:4], root=0, buf=b)),
            OVERLAP,
        ),
    ]


def judge(what: str, call, pattern: str) -> str | None:
    """None if ``call()`` raises weft.InvalidArgument (a ValueError) matching ``pattern``.

    (test_exception_hierarchy checks that weft exports InvalidArgument; here an exception
    class of that name is enough, so that the other problems still show.)"""
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - judged below
        if not is_invalid_argument(exc) or not isinstance(exc, ValueError):
            mro = [cls.__name__ for cls in type(exc).__mro__]
            return f"{what}: raised {mro}: {exc}; expected weft.InvalidArgument (a ValueError)"
        if not re.search(pattern, str(exc), re.IGNORECASE):
            return f"{what}: message {str(exc)!r} does not say what is wrong (/{pattern}/)"
        return None
    return f"{what}: did not raise"


def case_bad_arguments(ctx):
    """Makes every bad call on every rank, then checks that the communicator still works."""
    calls = bad_calls(ctx.comm, ctx.rank, ctx.size)
    if ctx.rank == 0:
        calls += root_only_bad_calls(ctx.comm, ctx.size)
    check = Checker(ctx.rank, ctx.note)
    for what, call, pattern in calls:
        with check.case(what):
            problem = judge(what, call, pattern)
            if problem:
                check.lines.append(f"rank {ctx.rank}: {problem}")
    with check.case("allreduce after the refused calls"):
        buf = np.full(1000, ctx.rank + 1, np.int32)
        ctx.comm.allreduce(buf)
        total = np.full(1000, ctx.size * (ctx.size + 1) // 2, np.int32)
        check.check(buf, total, "np.int32", "sum")
    return check.lines


@pytest.mark.parametrize(
    ("size", "transport"), [(2, "shm"), (2, "tcp")], ids=["ws2-shm", "ws2-tcp"]
)
def test_bad_arguments(pools, size, transport):
    assert_no_mismatch(pools.get(size, transport).run(case_bad_arguments))


# The operations' parameters, as a Python function's would be (help() shows these).
SIGNATURES = {
    "allreduce": "(self, /, buf, op='sum', out=None, async_=False)",
    "reduce_scatter": "(self, /, buf, op='sum', out=None, async_=False)",
    "allgather": "(self, /, buf, out=None, async_=False)",
    "broadcast": "(self, /, buf, root=0, async_=False)",
    "reduce": "(self, /, buf, root=0, op='sum', out=None, async_=False)",
    "barrier": "(self, /, async_=False)",
    "alltoall": "(self, /, buf, out, send_counts=None, recv_counts=None, async_=False)",
    "gather": "(self, /, buf, root=0, out=None, async_=False)",
    "scatter": "(self, /, out, root=0, buf=None, async_=False)",
    "send": "(self, /, buf, peer, tag=0, async_=False)",
    "recv": "(self, /, buf, peer=None, tag=0, async_=False)",
}


def test_call_arguments_are_matched_as_python_matches_them():
    """The operations take their arguments as Python functions do (they are bound through
    vectorcall, not pybind11's dispatcher), with Python's TypeErrors for calls that do not fit."""
    import inspect

    import torch.distributed as dist
    import weft

    for name, signature in SIGNATURES.items():
        assert str(inspect.signature(getattr(weft.Communicator, name))) == signature, name
    comm = weft.Communicator(dist.HashStore(), 0, 1, name="arguments")
    buf = np.arange(5, dtype=np.float32)
    out = np.zeros(5, np.float32)
    assert comm.allreduce(buf, "max", out) is out
    np.testing.assert_array_equal(out, buf)
    assert comm.allreduce(out=out, buf=buf, op="min").tolist() == buf.tolist()
    assert comm.allreduce(buf, async_=True).wait() is buf
    assert comm.reduce(buf, 0, "sum", out, False) is out
    assert comm.alltoall(buf, out, [5], recv_counts=[5]) is out
    refused = [
        (lambda: comm.allreduce(), r"allreduce\(\) missing required argument 'buf'"),
        (lambda: comm.allreduce(buf, bogus=1), r"unexpected keyword argument 'bogus'"),
        (lambda: comm.allreduce(buf, buf=buf), r"multiple values for argument 'buf'"),
        (lambda: comm.allreduce(buf, "sum", None, False, 1), r"at most 4 arguments"),
        (lambda: comm.allreduce(buf, op=3), r"op cannot be 3 \(int\)"),
        (lambda: comm.broadcast(buf, root="0"), r"root cannot be '0' \(str\)"),
        (lambda: comm.send(buf, 0, tag=-1), r"tag cannot be -1 \(int\)"),
        (lambda: comm.alltoall(buf), r"missing required argument 'out'"),
        (lambda: comm.alltoall(buf, out, send_counts=5), r"send_counts cannot be 5 \(int\)"),
        (lambda: comm.send(buf, tag=1), r"missing required argument 'peer'"),
    ]
    for call, message in refused:
        with pytest.raises(TypeError, match=message):
            call()
    np.testing.assert_array_equal(comm.allreduce(buf.copy(), op="sum"), buf)


def case_bad_construction(ctx, timeout_s):
    """Communicators with an impossible rank/size are refused at once on this rank."""
    import weft

    problems = []
    for what, rank, size in [
        ("rank == size", ctx.size, ctx.size),
        ("rank > size", ctx.size + 3, ctx.size),
        ("negative rank", -1, ctx.size),
        ("size 0", 0, 0),
    ]:
        name = ctx.fresh_name("bad")
        call = lambda r=rank, s=size, nm=name: weft.Communicator(  # noqa: E731
            ctx.store, r, s, name=nm, timeout=timeout_s
        )
        start = time.monotonic()
        problem = judge(f"Communicator({what}: rank={rank}, size={size})", call, r"rank|size")
        elapsed = time.monotonic() - start
        if problem:
            problems.append(f"rank {ctx.rank}: {problem}")
        elif elapsed > timeout_s / 2:
            problems.append(f"rank {ctx.rank}: {what}: refused only after {elapsed:.1f} s")
    return problems


def test_bad_construction(pools):
    assert_no_mismatch(pools.get(2, "shm").run(case_bad_construction, SHORT_TIMEOUT_S))


def case_ranks_out_of_step(ctx, calls, timeout_s):
    """Each rank allreduces its own (count, dtype) on a fresh communicator; returns what
    happened. The ring is forced so that every call runs the same algorithm, as a tuner may
    not."""
    import weft

    name = ctx.fresh_name("out-of-step")
    comm = weft.Communicator(
        ctx.store, ctx.rank, ctx.size, name=name, timeout=timeout_s, algo="ring"
    )
    count, dtype = calls[ctx.rank]
    buf = np.full(count, ctx.rank + 1, dtype)
    info = outcome(lambda: comm.allreduce(buf))
    info.pop("value", None)
    info["weft_error"] = "Error" in info.get("mro", [])
    wrong = np.flatnonzero(buf != ctx.size * (ctx.size + 1) // 2)
    info["wrong_elements"] = f"{wrong.size} (first at {wrong[:3].tolist()})" if wrong.size else 0
    return info


@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize(
    "calls",
    [
        [(1000, "int32"), (8, "int32")],
        [(2**20, "int32"), (2**19, "int32")],  # every message of the same length
        [(4096, "int32"), (4096, "float32")],  # the same bytes, another dtype
    ],
    ids=["small", "large", "dtype"],
)
def test_ranks_out_of_step_get_an_error_never_wrong_data(pools, transport, calls):
    """Ranks that issue different allreduces (a user error): some rank says so, naming the
    operation; every rank either raises a weft.Error within the timeout or holds the right
    sum -- never wrong data silently."""
    infos = pools.get(2, transport).run(case_ranks_out_of_step, calls, SHORT_TIMEOUT_S)
    report = "\n".join(f"rank {r} {calls[r]}: {info}" for r, info in enumerate(infos))
    for info in infos:
        assert info["weft_error"] or not info["wrong_elements"], f"wrong data, no error:\n{report}"
        assert info["elapsed"] <= SHORT_TIMEOUT_S + SLACK_S, f"too slow:\n{report}"
    told = [i for i in infos if "ranks out of step" in i.get("message", "")]
    assert told, f"no rank named the mismatch:\n{report}"
    assert all(re.search(r"allreduce #\d+ \(ring\)", i["message"]) for i in told), report


# ---- environment, read once per process -----------------------------------------------------


def scenario_construct(rank, size, store):
    """Builds a communicator with the default timeout; returns its timeout or the error."""

    def build():
        import weft

        return weft.Communicator(store, rank, size).timeout

    return outcome(build)


ENV_CASES = {
    "default timeout": ({}, 300.0, None),
    "WEFT_TIMEOUT_S=7.5": ({"WEFT_TIMEOUT_S": "7.5"}, 7.5, None),
    "WEFT_TIMEOUT_S=abc": ({"WEFT_TIMEOUT_S": "abc"}, None, "WEFT_TIMEOUT_S"),
    "WEFT_TRANSPORT=bogus": ({"WEFT_TRANSPORT": "bogus"}, None, "WEFT_TRANSPORT"),
    "WEFT_DEBUG=LOUD": ({"WEFT_DEBUG": "LOUD"}, None, "WEFT_DEBUG"),
    "WEFT_ALGO=bogus": ({"WEFT_ALGO": "bogus"}, None, "WEFT_ALGO"),
    "WEFT_CUDA_PATH=bogus": ({"WEFT_CUDA_PATH": "bogus"}, None, "WEFT_CUDA_PATH"),
    "WEFT_NCCL_MODE=bogus": ({"WEFT_NCCL_MODE": "bogus"}, None, "WEFT_NCCL_MODE"),
    "WEFT_CPU_PLACEMENT=bogus": ({"WEFT_CPU_PLACEMENT": "bogus"}, None, "WEFT_CPU_PLACEMENT"),
    "WEFT_NCCL_STEP_BYTES=0": ({"WEFT_NCCL_STEP_BYTES": "0"}, None, "WEFT_NCCL_STEP_BYTES"),
    "WEFT_TRACE_OPS=-1": ({"WEFT_TRACE_OPS": "-1"}, None, "WEFT_TRACE_OPS"),
    "WEFT_SCRATCH_CACHE_BYTES=x": (
        {"WEFT_SCRATCH_CACHE_BYTES": "x"},
        None,
        "WEFT_SCRATCH_CACHE_BYTES",
    ),
}


def test_environment_variables():
    """Each case is a world of one process; they run side by side."""
    worlds = {
        name: Ranks(scenario_construct, 1, env=env) for name, (env, _, _) in ENV_CASES.items()
    }
    problems = []
    try:
        for name, (_, timeout, variable) in ENV_CASES.items():
            info = worlds[name].result(0, timeout=120)
            if variable is None and info["raised"]:
                problems.append(f"{name}: raised {info['raised']}: {info['message']}")
            elif variable is None and info["value"] != pytest.approx(timeout):
                problems.append(f"{name}: .timeout is {info['value']!r}, expected {timeout}")
            elif variable is not None and info["raised"] != "InvalidArgument":
                problems.append(f"{name}: expected InvalidArgument, got {info}")
            elif variable is not None and variable not in info["message"]:
                problems.append(f"{name}: message {info['message']!r} does not name {variable}")
    finally:
        for world in worlds.values():
            world.close()
    assert not problems, "\n".join(problems)


# ---- mismatched world sizes -----------------------------------------------------------------


def scenario_claimed_size(rank, size, store, claimed_sizes, timeout_s):
    import weft

    claimed = claimed_sizes[rank]
    return outcome(lambda: weft.Communicator(store, rank, claimed, timeout=timeout_s).size)


@pytest.mark.parametrize("claimed_sizes", [[2, 3], [3, 2, 3]], ids=str)
def test_world_size_mismatch(claimed_sizes):
    n = len(claimed_sizes)
    with Ranks(scenario_claimed_size, n, claimed_sizes, SHORT_TIMEOUT_S) as ranks:
        infos = ranks.results(timeout=SHORT_TIMEOUT_S + SLACK_S + 60)
    report = "\n".join(f"rank {r} (size {claimed_sizes[r]}): {i}" for r, i in enumerate(infos))
    for info in infos:
        assert info["raised"] in ("InvalidArgument", "TimeoutError"), report
        assert info["elapsed"] <= SHORT_TIMEOUT_S + SLACK_S, report
    detected = [i for i in infos if i["raised"] == "InvalidArgument"]
    assert detected, f"no rank raised InvalidArgument:\n{report}"
    for info in detected:
        message = info["message"]
        assert re.search(r"size", message, re.I), f"message does not say size: {message!r}"
        numbers = set(re.findall(r"\d+", message))
        assert {str(s) for s in set(claimed_sizes)} <= numbers, (
            f"message does not name both sizes {sorted(set(claimed_sizes))}: {message!r}"
        )


# ---- a rank that never comes: timeout -------------------------------------------------------


def scenario_absent_peer(rank, size, store, timeout_s, set_later=False):
    """Rank 1 never calls allreduce; rank 0 must time out, then find the communicator aborted.
    ``set_later``: the communicator starts with a longer timeout and is given timeout_s after."""
    import weft

    comm = weft.Communicator(store, rank, size, timeout=timeout_s * (6 if set_later else 1))
    if set_later:
        comm.timeout = timeout_s
    if rank != 0:
        mark("idle")
        time.sleep(4 * timeout_s + 60)  # killed by the parent long before
        return None
    first = outcome(lambda: comm.allreduce(np.ones(1000, np.float32)))
    second = outcome(lambda: comm.allreduce(np.ones(1000, np.float32)))
    return {"first": first, "second": second}


@pytest.mark.parametrize("set_later", [False, True], ids=["at-creation", "set-later"])
@pytest.mark.parametrize("transport", ["shm", "tcp-forced"])
def test_timeout_names_the_operation(transport, set_later):
    env = {"WEFT_TRANSPORT": transport.removesuffix("-forced")}
    with Ranks(scenario_absent_peer, 2, SHORT_TIMEOUT_S, set_later, env=env) as ranks:
        got = ranks.result(0, timeout=SHORT_TIMEOUT_S + SLACK_S + 60)
    first, second = got["first"], got["second"]
    assert first["raised"] == "TimeoutError", f"expected weft.TimeoutError, got {first}"
    assert "Error" in first["mro"][1:], first
    assert SHORT_TIMEOUT_S - 1 <= first["elapsed"] <= SHORT_TIMEOUT_S + SLACK_S, (
        f"raised after {first['elapsed']:.1f} s with timeout {SHORT_TIMEOUT_S} s"
    )
    assert "allreduce" in first["message"], f"message does not name the op: {first['message']!r}"
    assert second["raised"] == "AbortedError", f"the next op: expected AbortedError, got {second}"
    assert second["elapsed"] < SLACK_S, f"AbortedError came after {second['elapsed']:.1f} s"


# ---- a peer killed in the middle of a large allreduce ---------------------------------------


def scenario_allreduce_loop(rank, size, store, nbytes, timeout_s):
    import weft

    comm = weft.Communicator(store, rank, size, timeout=timeout_s)
    buf = np.zeros(nbytes // 4, np.float32)
    done = 0

    def loop():
        nonlocal done
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            comm.allreduce(buf)
            done += 1
            if done == 2:
                mark("looping")

    first = outcome(loop)
    after = outcome(lambda: comm.allreduce(np.ones(10, np.float32)))
    return {"error": first, "completed": done, "after": after}


def shm_files() -> set[str]:
    return {p.name for p in Path("/dev/shm").glob("weft-*")}


SEQ = re.compile(r"(?:seq(?:uence)?(?:[ _-]?(?:number|no\.?|num|nr))?|#|op)\s*[:=#]?\s*(\d+)", re.I)
PEER_1 = re.compile(r"\b(?:peer|rank)\s*[:=#]?\s*1\b", re.I)


@pytest.mark.parametrize(
    "transport", ["shm", "tcp", *(rdma_backends.param(b, b, id=b) for b in rdma_backends.BACKENDS)]
)
def test_sigkill_peer_during_allreduce(transport):
    """A peer killed in the middle of 256 MiB allreduces: PeerError on the others in time, over
    shm, tcp and both RDMA back ends (one host identity per rank but for shm)."""
    shm_before = shm_files()
    if transport == "shm":
        env, env_per_rank = {"WEFT_TRANSPORT": "shm"}, None
    else:
        env = {} if transport == "tcp" else rdma_backends.env(transport)
        env_per_rank = lambda rank: {"WEFT_HOST_ID": f"weft-kill-host-{rank}"}  # noqa: E731
    args = (256 * 2**20, SHORT_TIMEOUT_S)
    with Ranks(scenario_allreduce_loop, 3, *args, env=env, env_per_rank=env_per_rank) as ranks:
        ranks.wait_mark(1, "looping", timeout=180)
        time.sleep(0.3)
        os.kill(ranks.pids[1], signal.SIGKILL)
        killed_at = time.time()
        survivors = {r: ranks.result(r, timeout=SHORT_TIMEOUT_S + SLACK_S + 30) for r in (0, 2)}
        exits = {r: ranks.wait_exit(r, timeout=30) for r in range(3)}
        left = processes_with_token(ranks.token)
    problems = []
    for rank, got in survivors.items():
        error, done = got["error"], got["completed"]
        where = f"rank {rank} ({done} allreduces completed)"
        if error["raised"] != "PeerError":
            problems.append(f"{where}: expected PeerError, got {error}")
            continue
        delay = error["time"] - killed_at
        if delay > SHORT_TIMEOUT_S + SLACK_S:
            problems.append(f"{where}: PeerError {delay:.1f} s after the kill")
        message = error["message"]
        if "allreduce" not in message:
            problems.append(f"{where}: message does not name the op: {message!r}")
        seqs = {int(m) for m in SEQ.findall(message)}
        if not seqs & {done, done + 1}:
            problems.append(f"{where}: message does not give seq {done} or {done + 1}: {message!r}")
        if not PEER_1.search(message):
            problems.append(f"{where}: message does not name peer 1: {message!r}")
        if got["after"]["raised"] not in ("AbortedError", "PeerError"):
            problems.append(f"{where}: next allreduce: expected AbortedError, got {got['after']}")
    for rank, code in exits.items():
        if code is None:
            problems.append(f"rank {rank} still running 30 s after the survivors reported")
        elif rank != 1 and code != 0:
            problems.append(f"rank {rank} exited with code {code}")
    if left:
        problems.append(f"processes left behind: {left}")
    time.sleep(0.5)
    leaked = shm_files() - shm_before
    if leaked:
        problems.append(f"/dev/shm files left behind: {sorted(leaked)}")
    assert not problems, "\n".join(problems)


def scenario_wait_for_root(rank, size, store, timeout_s):
    """Ranks 0 and 2 wait in a broadcast from rank 1, which never sends (it is killed): they
    only receive from it, so over RDMA no write of theirs can fail to tell them."""
    import weft

    comm = weft.Communicator(store, rank, size, timeout=timeout_s)
    comm.allreduce(np.ones(4, np.float32))  # every connection is up and used once
    mark("connected")
    if rank == 1:
        time.sleep(4 * timeout_s + 60)  # killed by the parent long before
        return None
    return outcome(lambda: comm.broadcast(np.zeros(1000, np.float32), 1))


@pytest.mark.parametrize(
    "transport", ["shm", "tcp", *(rdma_backends.param(b, b, id=b) for b in rdma_backends.BACKENDS)]
)
def test_sigkill_of_a_peer_others_only_receive_from(transport):
    if transport == "shm":
        env, env_per_rank = {"WEFT_TRANSPORT": "shm"}, None
    else:
        env = {} if transport == "tcp" else rdma_backends.env(transport)
        env_per_rank = lambda rank: {"WEFT_HOST_ID": f"weft-recv-host-{rank}"}  # noqa: E731
    with Ranks(scenario_wait_for_root, 3, SHORT_TIMEOUT_S, env=env, env_per_rank=env_per_rank) as r:
        for rank in range(3):
            r.wait_mark(rank, "connected", timeout=120)
        time.sleep(0.5)
        os.kill(r.pids[1], signal.SIGKILL)
        killed_at = time.time()
        got = {rank: r.result(rank, timeout=SHORT_TIMEOUT_S + SLACK_S + 30) for rank in (0, 2)}
    for rank, error in got.items():
        assert error["raised"] == "PeerError", f"rank {rank}: expected PeerError, got {error}"
        assert error["time"] - killed_at < 2, f"rank {rank}: {error['time'] - killed_at:.1f} s"
        assert PEER_1.search(error["message"]), error["message"]


def scenario_allreduce_once(rank, size, store):
    import weft

    buf = np.ones(2**20, np.float32)
    weft.Communicator(store, rank, size).allreduce(buf)
    return float(buf[0])


def test_no_shm_files_after_normal_exit():
    shm_before = shm_files()
    with Ranks(scenario_allreduce_once, 3, env={"WEFT_TRANSPORT": "shm"}) as ranks:
        assert ranks.results(timeout=120) == [3.0, 3.0, 3.0]
        codes = [ranks.wait_exit(r, timeout=30) for r in range(3)]
        left = processes_with_token(ranks.token)
    assert codes == [0, 0, 0], f"exit codes {codes}"
    assert not left, f"processes left behind: {left}"
    leaked = shm_files() - shm_before
    assert not leaked, f"/dev/shm files left behind: {sorted(leaked)}"
