"""WEFT_DEBUG=INFO: each rank prints to stderr, on lines starting "weft[rank N]", the transport
chosen for each peer and the algorithm chosen for each operation; without it, nothing."""

from __future__ import annotations

import re

import numpy as np
import pytest
from weft_proc import Ranks

OPS = (
    "allreduce",
    "reduce_scatter",
    "allgather",
    "broadcast",
    "reduce",
    "barrier",
    "alltoall",
    "gather",
    "scatter",
)
# A line about an op's algorithm says "algo"/"algorithm" or names a known algorithm family.
ALGO_WORDS = re.compile(
    r"algo|ring|tree|direct|one.?shot|two.?shot|recursive|halving|doubling|pairwise|linear|"
    r"bruck|hierarch|binomial|star|flat|chain|naive|simple|pipelin",
    re.I,
)
TRANSPORT_WORDS = re.compile(r"\b(shm|tcp)\b", re.I)


def scenario_every_op(rank, size, store):
    """Runs each collective once, small and large."""
    import weft

    comm = weft.Communicator(store, rank, size, timeout=60)
    for count in (8, 2**20):
        comm.allreduce(np.ones(count, np.float32))
        comm.reduce_scatter(np.ones(count * size, np.float32))
        comm.allgather(np.ones(count, np.float32))
        comm.broadcast(np.ones(count, np.float32), root=0)
        comm.reduce(np.ones(count, np.float32), root=0)
        comm.barrier()
        comm.alltoall(np.ones(count * size, np.float32), np.ones(count * size, np.float32))
        comm.gather(np.ones(count, np.float32), root=0)
        buf = np.ones(count * size, np.float32) if rank == 0 else None
        comm.scatter(np.ones(count, np.float32), root=0, buf=buf)
    return True


def mentions_peer(text: str, peer: int) -> bool:
    return re.search(rf"(?:\b(?:peer|rank)s?\s*[:=#]?\s*|->\s*){peer}\b", text, re.I) is not None


def mentions_op(text: str, op: str) -> bool:
    return re.search(rf"(?<!\w){op}(?!\w)", text) is not None


def weft_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("weft")]


def check_rank_log(rank: int, size: int, stderr: str, hosts: list[str], forced: str | None):
    """Problems with one rank's INFO log (empty if it is right)."""
    lines = weft_lines(stderr)
    prefix = f"weft[rank {rank}]"
    problems = [
        f"line without the prefix {prefix!r}: {line!r}"
        for line in lines
        if not line.startswith(prefix)
    ]
    bodies = [line[len(prefix) :] for line in lines if line.startswith(prefix)]
    # Lines may list several peers; judge each comma/semicolon-separated part on its own.
    parts = [part for body in bodies for part in re.split(r"[;,]", body)]
    for peer in range(size):
        if peer == rank:
            continue
        expected = forced or ("shm" if hosts[peer] == hosts[rank] else "tcp")
        said = {
            word.lower()
            for part in parts
            if mentions_peer(part, peer)
            for word in TRANSPORT_WORDS.findall(part)
        }
        if said != {expected}:
            problems.append(f"transport to peer {peer}: expected {expected!r}, log says {said}")
    for op in OPS:
        if not any(mentions_op(body, op) and ALGO_WORDS.search(body) for body in bodies):
            problems.append(f"no line names the algorithm chosen for {op}")
    return problems


WORLDS = {
    # name: (host identity per rank or None, WEFT_TRANSPORT)
    "two-hosts-auto": (["host-a", "host-a", "host-b"], None),
    "one-host-auto": (None, None),
    "one-host-tcp-forced": (None, "tcp"),
}


@pytest.mark.parametrize("world", list(WORLDS))
def test_info_log_names_transports_and_algorithms(world):
    hosts, forced = WORLDS[world]
    size = 3
    env = {"WEFT_DEBUG": "INFO", **({"WEFT_TRANSPORT": forced} if forced else {})}
    env_per_rank = (lambda rank: {"WEFT_HOST_ID": hosts[rank]}) if hosts else None
    with Ranks(scenario_every_op, size, env=env, env_per_rank=env_per_rank) as ranks:
        ranks.results(timeout=180)
        logs = [ranks.stderr(r) for r in range(size)]
    report = []
    for rank, stderr in enumerate(logs):
        problems = check_rank_log(rank, size, stderr, hosts or ["same"] * size, forced)
        if problems:
            shown = "\n    ".join(weft_lines(stderr)[:40]) or "(no weft lines)"
            report.append(f"rank {rank}:\n  " + "\n  ".join(problems) + f"\n  log:\n    {shown}")
    assert not report, "\n".join(report)


def test_silent_by_default():
    with Ranks(
        scenario_every_op, 3, env_per_rank=lambda rank: {"WEFT_HOST_ID": "ab"[rank % 2]}
    ) as ranks:
        ranks.results(timeout=180)
        logs = [ranks.stderr(r) for r in range(3)]
    for rank, stderr in enumerate(logs):
        assert "weft[" not in stderr, f"rank {rank} logged without WEFT_DEBUG:\n{stderr}"


def scenario_connect(rank, size, store):
    import weft

    weft.Communicator(store, rank, size, timeout=60).barrier()


def test_shm_cma_pool_sends_by_reference():
    # The tests' shm-cma pool (weft_pool.py) checks Plans against sends by reference; where the
    # kernel refuses process_vm_readv, shared memory silently copies and those tests prove less.
    env = {"WEFT_DEBUG": "INFO", "WEFT_TRANSPORT": "shm", "WEFT_SHM_CMA": "1"}
    with Ranks(scenario_connect, 2, env=env) as ranks:
        ranks.results(timeout=120)
        logs = [ranks.stderr(r) for r in range(2)]
    if any("sends by reference unavailable" in stderr for stderr in logs):
        pytest.skip("the kernel refuses process_vm_readv between these processes")
    for stderr in logs:
        assert "sends by reference on" in stderr, "\n".join(weft_lines(stderr))
