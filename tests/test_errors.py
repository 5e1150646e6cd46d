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
from weft_proc import Ranks, mark, outcome, processes_with_token
from weft_ref import Checker

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


def zeros(n, dtype=np.float32):
    return np.zeros(n, dtype)


def readonly(n):
    a = np.zeros(n, np.float32)
    a.flags.writeable = False
    return a


def strided(n):
    return np.zeros(2 * n, np.float32)[::2]


def bad_calls(comm, rank: int, n: int) -> list[tuple]:
    """[(description, call, regex the message must match)], the same on every rank."""
    import torch

    def t(dtype, count=8):
        return torch.zeros(count, dtype=getattr(torch, dtype))

    calls = [
        ("allreduce of a read-only array", lambda: comm.allreduce(readonly(8)), READ_ONLY),
        ("allreduce into a read-only out", lambda: comm.allreduce(zeros(8), out=readonly(8)), READ_ONLY),
        ("broadcast of a read-only array", lambda: comm.broadcast(readonly(8)), READ_ONLY),
        ("reduce of a read-only array", lambda: comm.reduce(readonly(8), root=0), READ_ONLY),
        ("allgather into a read-only out", lambda: comm.allgather(zeros(4), out=readonly(4 * n)), READ_ONLY),
        ("recv into a read-only array", lambda: comm.recv(readonly(8), peer=(rank + 1) % n), READ_ONLY),
        ("allreduce float32 -> float64 out", lambda: comm.allreduce(zeros(8), out=zeros(8, np.float64)), MISMATCH),
        ("allgather float32 -> int32 out", lambda: comm.allgather(zeros(4), out=zeros(4 * n, np.int32)), MISMATCH),
        ("reduce_scatter float32 -> float64 out", lambda: comm.reduce_scatter(zeros(4 * n), out=zeros(4, np.float64)), MISMATCH),
        ("reduce float32 -> float16 out", lambda: comm.reduce(zeros(8), root=0, out=zeros(8, np.float16)), MISMATCH),
        ("alltoall float32 -> float64 out", lambda: comm.alltoall(zeros(4 * n), zeros(4 * n, np.float64)), MISMATCH),
        ("allreduce torch bfloat16 -> float16 out", lambda: comm.allreduce(t("bfloat16"), out=t("float16")), MISMATCH),
        ("allreduce out too small", lambda: comm.allreduce(zeros(8), out=zeros(7)), TOO_SMALL),
        ("allgather out too small", lambda: comm.allgather(zeros(4), out=zeros(4 * n - 1)), TOO_SMALL),
        ("reduce_scatter out too small", lambda: comm.reduce_scatter(zeros(4 * n), out=zeros(3)), TOO_SMALL),
        ("reduce out too small", lambda: comm.reduce(zeros(8), root=0, out=zeros(7)), TOO_SMALL),
        ("alltoall out too small", lambda: comm.alltoall(zeros(4 * n), zeros(4 * n - 1)), TOO_SMALL),
        ("alltoall send_counts beyond buf", lambda: comm.alltoall(zeros(n), zeros(2 * n), send_counts=[2] * n, recv_counts=[2] * n), TOO_SMALL),
        ("alltoall with size+1 counts", lambda: comm.alltoall(zeros(n + 1), zeros(n + 1), send_counts=[1] * (n + 1), recv_counts=[1] * (n + 1)), r"count|size"),
        ("reduce_scatter out=None, len not divisible by size", lambda: comm.reduce_scatter(zeros(4 * n + 1)), r"divisib|multiple"),
        ("allreduce of a strided numpy view", lambda: comm.allreduce(strided(8)), CONTIGUOUS),
        ("allreduce of a Fortran-order 2-D array", lambda: comm.allreduce(np.zeros((4, 3), np.float32, order="F")), CONTIGUOUS),
        ("allreduce of a transposed torch tensor", lambda: comm.allreduce(torch.zeros(4, 3).t()), CONTIGUOUS),
        ("allreduce into a strided out", lambda: comm.allreduce(zeros(8), out=strided(8)), CONTIGUOUS),
        ("allgather of a strided numpy view", lambda: comm.allgather(strided(8)), CONTIGUOUS),
        ("allreduce with op='bogus'", lambda: comm.allreduce(zeros(8), op="bogus"), r"bogus|op"),
        ("broadcast with root=size", lambda: comm.broadcast(zeros(8), root=n), r"root|rank"),
        ("reduce with root=size", lambda: comm.reduce(zeros(8), root=n), r"root|rank"),
        ("send to peer=size", lambda: comm.send(zeros(8), n), r"peer|rank"),
        ("recv from peer=size", lambda: comm.recv(zeros(8), peer=n), r"peer|rank"),
    ]
    for dtype in ("complex64", "bool", "uint16"):
        pattern = f"{DTYPE}|{dtype}"
        calls.append((f"allreduce of numpy {dtype}", lambda d=dtype: comm.allreduce(zeros(8, d)), pattern))
        calls.append((f"broadcast of numpy {dtype}", lambda d=dtype: comm.broadcast(zeros(8, d)), pattern))
    for dtype in ("complex64", "bool"):
        calls.append((f"allreduce of torch {dtype}", lambda d=dtype: comm.allreduce(t(d)), f"{DTYPE}|{dtype}"))
    return calls


def root_only_bad_calls(comm, n: int) -> list[tuple]:
    """Bad only at the root (0): the other ranks must not make the call at all."""
    return [
        ("gather out too small (at root)", lambda: comm.gather(zeros(4), root=0, out=zeros(4 * n - 1)), TOO_SMALL),
        ("scatter buf too small (at root)", lambda: comm.scatter(zeros(4), root=0, buf=zeros(4 * n - 1)), TOO_SMALL),
    ]


def describe_error(call) -> dict:
    import weft

    info = outcome(call)
    if info["raised"]:
        info["invalid_argument"] = isinstance(info.pop("exception"), getattr(weft, "InvalidArgument", ()))
    return info


def case_bad_arguments(ctx):
    """Makes every bad call, then checks the communicator still works."""
    calls = bad_calls(ctx.comm, ctx.rank, ctx.size)
    if ctx.rank == 0:
        calls += root_only_bad_calls(ctx.comm, ctx.size)
    found = {}
    for what, call, pattern in calls:
        ctx.note(what)
        found[what] = (outcome(call, keep_exception=True), pattern)
    check = Checker(ctx.rank, ctx.note)
    with check.case("allreduce after the refused calls"):
        buf = np.full(1000, ctx.rank + 1, np.int32)
        ctx.comm.allreduce(buf)
        check.check(buf, np.full(1000, ctx.size * (ctx.size + 1) // 2, np.int32), "np.int32", "sum")
    return [_judge(what, info, pattern) for what, (info, pattern) in found.items()], check.lines
