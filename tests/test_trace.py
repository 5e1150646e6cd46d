"""The flight recorder on real ranks: each case makes a failure happen in a world of 4, every
rank writes its trace into WEFT_TRACE_DIR (on the failing operation, or on SIGTERM), and
``python -m weft.trace`` must name the right rank and say what went wrong on its first line.

One world runs every case, each on a communicator of its own; the last case ends rank 1 with
SIGTERM. A killed rank's verdict ("rank 1 died") is checked by tests/test_failure.py."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from weft_proc import Ranks, mark, outcome

TIMEOUT_S = 3.0
ODD = 2  # the rank that calls something else
SLOW = 1  # the rank that falls behind
COUNT = 1000
MISMATCHES = ("op", "size", "dtype", "order")


def mismatched_calls(comm, case: str, odd: bool):
    """The calls of one rank in case ``case``: the odd rank's differ from the others' in it."""
    f32 = np.ones(COUNT, np.float32)
    if case == "op":
        return [lambda: comm.broadcast(f32, root=0) if odd else comm.allreduce(f32)]
    if case == "size":
        n = COUNT + 1 if odd else COUNT
        return [lambda: comm.allreduce(np.ones(n, np.float32))]
    if case == "dtype":
        buf = np.ones(COUNT, np.int32) if odd else f32
        return [lambda: comm.allreduce(buf)]
    # order: both issued before either is waited for, as a training step's buckets are
    gathered = np.zeros(COUNT * comm.size, np.float32)
    first = [
        lambda: comm.allreduce(f32, async_=True),
        lambda: comm.allgather(f32, out=gathered, async_=True),
    ]
    return [lambda: [h.wait() for h in [c() for c in (first[::-1] if odd else first)]]]


def scenario_cases(rank, size, store):
    import weft

    infos = {}
    for case in MISMATCHES:
        comm = weft.Communicator(store, rank, size, name=f"case-{case}", timeout=TIMEOUT_S)
        comm.allreduce(np.ones(10, np.float32))  # a history before the mismatch
        for call in mismatched_calls(comm, case, rank == ODD):
            infos[case] = outcome(call)
        del comm
    comm = weft.Communicator(store, rank, size, name="case-behind", timeout=TIMEOUT_S)
    comm.allreduce(np.ones(10, np.float32))
    if rank == SLOW:
        mark("sleeping")
        time.sleep(120)  # ended by the parent's SIGTERM
    infos["behind"] = outcome(lambda: comm.allreduce(np.ones(COUNT, np.float32)))
    return {case: {k: info.get(k) for k in ("raised", "message")} for case, info in infos.items()}


EXPECTED = {
    "op": rf"^rank {ODD} differs in op at operation #1: it called broadcast",
    "size": rf"^rank {ODD} differs in size at operation #1: it called allreduce #1 \(1001 float32",
    "dtype": rf"^rank {ODD} differs in dtype at operation #1: it called allreduce #1 \(1000 int32",
    "order": rf"^rank {ODD} differs in order at operation #1: it called allgather",
    "behind": rf"^rank {SLOW} is behind.* it was in allreduce #0 .*completed.*SIGTERM",
}


def verdict(directory) -> str:
    """The verdict, read in this process (the command line is tested below)."""
    from weft.trace import verdict as read_verdict

    return "\n".join(read_verdict(directory))


def verdict_from_command_line(directory) -> str:
    run = subprocess.run(
        [sys.executable, "-m", "weft.trace", str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    return run.stdout


@pytest.fixture(scope="module", params=["shm", "tcp"])
def traced(request, tmp_path_factory):
    """The trace directory after every case ran, and each rank's outcomes, over each transport."""
    trace_dir = tmp_path_factory.mktemp("traces")
    env = {
        "WEFT_TRANSPORT": request.param,
        "WEFT_TUNE": "off",
        "WEFT_ALGO": "ring",
        "WEFT_TRACE_DIR": str(trace_dir),
    }
    with Ranks(scenario_cases, 4, env=env) as ranks:
        ranks.wait_mark(SLOW, "sleeping", timeout=120)
        others = {r: ranks.result(r, timeout=120) for r in range(4) if r != SLOW}
        os.kill(ranks.pids[SLOW], signal.SIGTERM)
        code = ranks.wait_exit(SLOW, timeout=30)
    assert code == -signal.SIGTERM, f"rank {SLOW} exited with {code} after SIGTERM"
    return trace_dir, others


@pytest.mark.parametrize("case", [*MISMATCHES, "behind"])
def test_verdict_names_the_rank(traced, tmp_path, case):
    trace_dir, others = traced
    for path in trace_dir.glob(f"case-{case}.rank*.weft-trace"):
        shutil.copy(path, tmp_path)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert len(files) == 4, f"expected a trace from each of the 4 ranks, got {files}"
    for rank, infos in others.items():
        assert infos[case]["raised"], f"rank {rank} did not fail in case {case}: {infos[case]}"
    text = verdict(tmp_path)
    assert re.search(EXPECTED[case], text.splitlines()[0]), text


def test_every_rank_is_listed_with_its_error(traced, tmp_path):
    trace_dir, _ = traced
    for path in trace_dir.glob("case-behind.rank*.weft-trace"):
        shutil.copy(path, tmp_path)
    lines = verdict_from_command_line(tmp_path).splitlines()
    assert re.search(EXPECTED["behind"], lines[0]), lines
    for rank in range(4):
        assert any(line.startswith(f"  rank {rank}: ") for line in lines), lines
    assert any("nothing arrived for" in line for line in lines), lines


def test_empty_directory_says_what_is_missing(tmp_path):
    run = subprocess.run(
        [sys.executable, "-m", "weft.trace", str(tmp_path)], capture_output=True, text=True
    )
    assert run.returncode == 2
    assert "WEFT_TRACE_DIR" in run.stderr


GOOD_HEADER = "weft-trace 1\ncomm c\nrank 0\nsize 2\npid 1\n"
GOOD_OP = (
    "op seq=0 name=allreduce dtype=float32 reduce=sum count=8 root=-1 algorithm=ring "
    "peers=1 state=done start_us=1 end_us=2\n"
)


@pytest.mark.parametrize(
    "text, says",
    [
        (GOOD_HEADER + GOOD_OP.replace("count=8", "count=eight"), "line 6: not an operation"),
        (GOOD_HEADER + GOOD_OP.replace(" state=done", ""), "line 6: not an operation"),
        (GOOD_HEADER.replace("size 2", "size two") + GOOD_OP, "header is incomplete or wrong"),
        (GOOD_HEADER.replace("pid 1\n", "") + GOOD_OP, "header is incomplete or wrong"),
        (GOOD_HEADER.replace("rank 0", "rank 5") + GOOD_OP, "rank 5 of a world of 2"),
        (GOOD_HEADER.replace("size 2", "size 2212122121") + GOOD_OP, "at most 1048576 ranks"),
        ("not a trace\n", "not a weft flight-recorder file"),
    ],
    ids=[
        "count",
        "missing-field",
        "size",
        "no-pid",
        "rank-out-of-world",
        "huge-world",
        "not-a-trace",
    ],
)
def test_a_broken_trace_file_is_named_not_a_traceback(tmp_path, text, says):
    (tmp_path / "c.rank0.weft-trace").write_text(text)
    run = subprocess.run(
        [sys.executable, "-m", "weft.trace", str(tmp_path)], capture_output=True, text=True
    )
    assert run.returncode == 2 and says in run.stderr and "Traceback" not in run.stderr, run


# A CI run's traces when rank 1 was stopped between the two rounds of recursive doubling: rank 0
# finished operation #3 with rank 2, rank 3 was left waiting for rank 1 in it, and rank 1, once
# continued, timed out too. Ranks 0 and 3 timed out first and said rank 1 had not.
TIMEOUT = "nothing arrived for 10 s (the communicator's timeout)"
STOPPED_BETWEEN_ROUNDS = {
    0: (4, "allreduce #4 (rd, step 1/2) on rank 0 waiting to receive from rank 1: "
           f"{TIMEOUT}; rank 1 is hung or slow: it did not time out itself"),
    1: (3, "allreduce #3 (rd, step 1/2) on rank 1 waiting to receive from rank 0: "
           f"{TIMEOUT}; rank 0 timed out too, waiting for rank 1"),
    2: (4, "allreduce #4 (rd) on rank 2: lost rank 3: connection to peer closed; rank 3 had "
           f"aborted: allreduce #3 (rd, step 2/2) on rank 3 waiting to receive from rank 1: "
           f"{TIMEOUT}"),
    3: (3, "allreduce #3 (rd, step 2/2) on rank 3 waiting to receive from rank 1: "
           f"{TIMEOUT}; rank 1 is hung or slow: it did not time out itself"),
}  # fmt: skip


def test_a_stopped_rank_that_timed_out_once_continued_is_still_the_one_behind(tmp_path):
    for rank, (last, reason) in STOPPED_BETWEEN_ROUNDS.items():
        ops = "".join(
            GOOD_OP.replace("seq=0", f"seq={seq}")
            .replace("algorithm=ring", "algorithm=rd")
            .replace("state=done", "state=failed" if seq == last else "state=done")
            for seq in range(last + 1)
        )
        header = GOOD_HEADER.replace("rank 0", f"rank {rank}").replace("size 2", "size 4")
        (tmp_path / f"c.rank{rank}.weft-trace").write_text(f"{header}reason {reason}\n{ops}")
    run = subprocess.run(
        [sys.executable, "-m", "weft.trace", str(tmp_path)], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    first = run.stdout.splitlines()[0]
    assert first.startswith("rank 1 is behind (hung or slow): ranks 0 and 3 timed out"), first


def scenario_aborted(rank, size, store):
    """Rank SLOW falls behind and is ended by SIGABRT (what torchrun's watchdog and abort()
    send); it must leave no core file behind."""
    import resource

    import weft

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    comm = weft.Communicator(store, rank, size, name="case-aborted", timeout=TIMEOUT_S)
    comm.allreduce(np.ones(10, np.float32))
    if rank == SLOW:
        mark("sleeping")
        time.sleep(120)  # ended by the parent's SIGABRT
    return outcome(lambda: comm.allreduce(np.ones(COUNT, np.float32)))


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_sigabrt_writes_the_trace_and_the_verdict_names_it(tmp_path, transport):
    env = {"WEFT_TRANSPORT": transport, "WEFT_TUNE": "off", "WEFT_TRACE_DIR": str(tmp_path)}
    size = 4
    with Ranks(scenario_aborted, size, env=env) as ranks:
        ranks.wait_mark(SLOW, "sleeping", timeout=120)
        for rank in range(size):
            if rank != SLOW:
                assert ranks.result(rank, timeout=60)["raised"]
        os.kill(ranks.pids[SLOW], signal.SIGABRT)
        code = ranks.wait_exit(SLOW, timeout=30)
    assert code == -signal.SIGABRT, f"rank {SLOW} exited with {code} after SIGABRT"
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == [f"case-aborted.rank{r}.weft-trace" for r in range(size)], files
    first = verdict(tmp_path).splitlines()[0]
    assert re.search(rf"^rank {SLOW} is behind.*SIGABRT", first), first


def scenario_left_alone(rank, size, store):
    """Ten allreduces; then rank 1 leaves and rank 0's next one fails."""
    import weft

    comm = weft.Communicator(store, rank, size, name="kept", timeout=TIMEOUT_S)
    for _ in range(10):
        comm.allreduce(np.ones(10, np.float32))
    if rank == 1:
        return {}
    return outcome(lambda: comm.allreduce(np.ones(10, np.float32)))


@pytest.mark.parametrize("kept", [None, "4", "0"])
def test_weft_trace_ops_is_how_many_operations_the_trace_keeps(tmp_path, kept):
    env = {"WEFT_TRANSPORT": "shm", "WEFT_TUNE": "off", "WEFT_TRACE_DIR": str(tmp_path)}
    if kept is not None:
        env["WEFT_TRACE_OPS"] = kept
    with Ranks(scenario_left_alone, 2, env=env) as ranks:
        assert ranks.result(0, timeout=60)["raised"]
    lines = (tmp_path / "kept.rank0.weft-trace").read_text().splitlines()
    ops = [line for line in lines if line.startswith("op ")]
    assert any(line.startswith("reason ") for line in lines)
    expected = 12 if kept is None else int(kept)  # creation, allreduces #0-#9 and #10
    assert len(ops) == expected, ops
    if ops:
        assert " seq=10 name=allreduce " in ops[-1] and "state=failed" in ops[-1], ops[-1]
    # Rank 1 left without a trace: the verdict says so with or without operations listed.
    assert verdict(tmp_path).startswith("rank 1 died: it wrote no trace"), verdict(tmp_path)
