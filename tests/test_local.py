"""weft.local.spawn, which the benchmarks launch local ranks with: results in rank order, and a
rank that fails, dies or hangs is reported (naming it) instead of waiting out the timeout."""

from __future__ import annotations

import os
import time

import pytest
import weft.local


def rank_and_size(rank, size, store, tag):
    return (tag, rank, size)


def second_rank_dies(rank, size, store):
    if rank == 1:
        os._exit(3)
    return rank


def second_rank_raises(rank, size, store):
    if rank == 1:
        raise ValueError("rank 1 was told to fail")
    return rank


def sleeps(rank, size, store):
    time.sleep(60)


def test_results_come_back_in_rank_order():
    assert weft.local.spawn(rank_and_size, 3, "x", timeout=60) == [("x", r, 3) for r in range(3)]


def test_a_rank_that_dies_is_named_at_once():
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="rank 1 exited with code 3 before it returned"):
        weft.local.spawn(second_rank_dies, 2, timeout=60)
    assert time.monotonic() - started < 30  # the start of two interpreters, not the timeout


def test_a_rank_that_raises_is_reported_with_its_traceback():
    with pytest.raises(RuntimeError, match="(?s)rank 1 failed:.*rank 1 was told to fail"):
        weft.local.spawn(second_rank_raises, 2, timeout=60)


def test_ranks_that_take_too_long_are_killed_with_a_timeout_error():
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"ranks \[0, 1\] returned no result within 4 s"):
        weft.local.spawn(sleeps, 2, timeout=4)
    assert time.monotonic() - started < 15
