"""Run a function on N local ranks, each its own process, joined by a TCPStore.

Used by the benchmark and by anyone who wants a quick multi-rank job without
torchrun: ``weft.local.spawn(fn, 2, arg)`` calls ``fn(rank, size, store, arg)``
in two fresh processes and returns their results in rank order.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import random
import socket
import time
import traceback

# Where free_port() looks first: below the kernel's ephemeral range.
PORT_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
LOWEST_PORT = 10000
# How often spawn looks for results and for ranks that died.
POLL_S = 0.2
DONE_KEY = "weft.local.done"


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on, for a store the ranks then connect to.

    Taken below the kernel's ephemeral range where there is room: a port from inside it (what
    binding port 0 returns) can be given to some outgoing connection before the store listens
    on it, and the store then fails with "address already in use"."""
    try:
        with open(PORT_RANGE_FILE) as f:
            ephemeral_low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = LOWEST_PORT
    candidates = list(range(LOWEST_PORT, ephemeral_low))
    for port in random.sample(candidates, min(len(candidates), 100)) + [0]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise OSError("no free TCP port on 127.0.0.1")


def make_store(rank: int, size: int, port: int, timeout_s: float = 60.0):
    from datetime import timedelta

    import torch.distributed as dist

    return dist.TCPStore(
        "127.0.0.1", port, size, rank == 0, timedelta(seconds=timeout_s), wait_for_workers=False
    )


def _child(fn, rank, size, port, env, args, results):
    os.environ.update(env or {})
    try:
        store = make_store(rank, size, port)
        results.put((rank, True, fn(rank, size, store, *args)))
    except BaseException:  # noqa: BLE001 - reported to the parent
        results.put((rank, False, traceback.format_exc()))
        return  # the parent stops every rank
    # Rank 0's process serves the store: it stays until every rank is done with it.
    store.add(DONE_KEY, 1)
    while rank == 0 and store.add(DONE_KEY, 0) < size:
        time.sleep(0.01)


def spawn(fn, size: int, *args, env: dict | None = None, timeout: float = 600.0) -> list:
    """Runs ``fn(rank, size, store, *args)`` on ``size`` processes.

    ``fn`` must be importable (a module-level function). Raises RuntimeError with the failing
    rank's traceback if any rank fails, or naming a rank whose process died before it returned;
    TimeoutError, after killing every rank still running, when the results take longer than
    ``timeout`` seconds.
    """
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=_child, args=(fn, r, size, port, env, args, results), daemon=True)
        for r in range(size)
    ]
    for p in procs:
        p.start()
    finished = False
    try:
        collected = _collect(procs, results, timeout)
        finished = True
    finally:
        for p in procs:
            p.join(timeout=10 if finished else 0)
            if p.is_alive():
                p.kill()
                p.join()
    return [collected[r] for r in range(size)]


def _collect(procs: list, results, timeout: float) -> dict[int, object]:
    """Every rank's result, by rank; raises as soon as one fails or dies without one."""
    deadline = time.monotonic() + timeout
    collected: dict[int, object] = {}
    suspects: set[int] = set()  # exited without a result at the last look
    while len(collected) < len(procs):
        try:
            rank, ok, value = results.get(timeout=POLL_S)
        except queue.Empty:
            # A rank that exited after putting its result has it in the pipe: one more look
            # before calling it dead.
            gone = {r for r, p in enumerate(procs) if r not in collected and p.exitcode is not None}
            if gone & suspects:
                r = min(gone & suspects)
                raise RuntimeError(
                    f"rank {r} exited with code {procs[r].exitcode} before it returned a result "
                    "(a negative code is the signal that ended it)"
                ) from None
            suspects = gone
            if time.monotonic() > deadline:
                missing = [r for r in range(len(procs)) if r not in collected]
                raise TimeoutError(
                    f"ranks {missing} returned no result within {timeout:g} s; they were killed"
                ) from None
            continue
        if not ok:
            raise RuntimeError(f"rank {rank} failed:\n{value}")
        collected[rank] = value
    return collected
