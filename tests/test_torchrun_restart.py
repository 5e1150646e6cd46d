"""torchrun and a killed worker (issue 45, item 10). Without restarts: with a weft process
group of timeout T, SIGKILLing one worker in the middle of its allreduces makes the job exit
non-zero within T + 5 s, leaving no process behind. With --max-restarts 1: torchrun restarts
the group, whose new weft communicators bootstrap again, and examples/ddp.py resumes from its
checkpoint to the very model (parameters and optimizer state) an uninterrupted run ends with.
Both with 4 workers, over shm and over tcp."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import torch
import weft.local
from weft_proc import TOKEN_VAR, processes_with_token

TESTS = Path(__file__).resolve().parent
DDP_EXAMPLE = TESTS.parent / "examples" / "ddp.py"
T_S = 10.0
WORKERS = 4
TRANSPORTS = pytest.mark.parametrize("transport", ["shm", "tcp"])


def torchrun(
    restarts: int, script: Path, *args: str, token: str, transport: str
) -> subprocess.Popen:
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(WORKERS),
            "--max-restarts", str(restarts), "--master-port", str(weft.local.free_port()),
            str(script), *args]  # fmt: skip
    env = {**os.environ, TOKEN_VAR: token, "OMP_NUM_THREADS": "1", "WEFT_TUNE": "off",
           "WEFT_TRANSPORT": transport}  # fmt: skip
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def run_and_kill(
    victim, restarts: int, script: Path, *args: str, transport: str
) -> tuple[int, float, str, str]:
    """Starts torchrun and SIGKILLs the worker ``victim(token)`` returns once it returns one;
    (exit code, seconds from the kill to the exit, output, token)."""
    token = uuid.uuid4().hex
    job = torchrun(restarts, script, *args, token=token, transport=transport)
    try:
        deadline = time.monotonic() + 120
        pid = None
        while pid is None and time.monotonic() < deadline and job.poll() is None:
            pid = victim(token)
            time.sleep(0.05)
        assert pid, f"the workers never got far enough: {job.poll()}"
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        rc = job.wait(120)
        took = time.monotonic() - killed
        output = job.stdout.read().decode(errors="replace")
    finally:
        if job.poll() is None:
            job.kill()
            job.wait(10)
    return rc, took, output, token


def rank1_once_all_wrote_pids(out: Path):
    """For torchrun_loop.py: rank 1's pid, once every worker wrote its own into ``out``."""

    def victim(_token):
        pids = {f.stem: f.read_text() for f in out.glob("rank*.pid")}
        if len(pids) < WORKERS or not all(pids.values()):
            return None
        return int(pids["rank1"])

    return victim


def worker_of_rank(token: str, rank: int) -> int | None:
    """The live torchrun worker of ``rank`` among the processes carrying ``token``."""
    for pid in processes_with_token(token, kill=False):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in environ and b"TORCHELASTIC_RUN_ID=" in b" ".join(environ):
            return pid
    return None


@TRANSPORTS
def test_a_killed_worker_ends_the_job_within_the_timeout(tmp_path, transport):
    victim = rank1_once_all_wrote_pids(tmp_path)
    script = TESTS / "torchrun_loop.py"
    args = (str(tmp_path), str(T_S), "120")
    rc, took, output, token = run_and_kill(victim, 0, script, *args, transport=transport)
    assert rc != 0, output[-3000:]
    assert took < T_S + 5, f"the job took {took:.1f} s to end after the kill\n{output[-3000:]}"
    time.sleep(0.5)
    assert processes_with_token(token) == [], "processes left behind"


STEPS, SAVE_EVERY = 600, 50


@TRANSPORTS
def test_torchrun_restarts_the_group_and_ddp_resumes_from_its_checkpoint(tmp_path, transport):
    """A worker killed once the example saved its first checkpoint; the restarted group
    resumes from a checkpoint and ends where an uninterrupted run does, bit for bit."""
    flags = ["--steps", str(STEPS), "--save-every", str(SAVE_EVERY)]
    reference = tmp_path / "uninterrupted.pt"
    token = uuid.uuid4().hex
    job = torchrun(
        0, DDP_EXAMPLE, *flags, "--checkpoint", str(reference), token=token, transport=transport
    )
    output = job.communicate(timeout=180)[0].decode(errors="replace")
    assert job.returncode == 0, output[-3000:]

    restarted = tmp_path / "restarted.pt"

    def victim(token):
        return worker_of_rank(token, 1) if restarted.exists() else None

    flags += ["--checkpoint", str(restarted)]
    rc, _, output, token = run_and_kill(victim, 1, DDP_EXAMPLE, *flags, transport=transport)
    assert rc == 0, output[-3000:]
    resumed = {int(s) for s in re.findall(r"rank \d+: resumed from step (\d+)", output)}
    assert len(resumed) == 1 and 0 < min(resumed) < STEPS, f"did not resume: {output[-3000:]}"
    ranks = sorted(re.findall(r"rank (\d+): ok", output))
    assert ranks == [str(r) for r in range(WORKERS)], output[-3000:]
    want, got = torch.load(reference), torch.load(restarted)
    assert got["step"] == want["step"] == STEPS
    for name, tensor in want["model"].items():
        assert torch.equal(got["model"][name], tensor), f"{name} differs from the uninterrupted run"
    momenta = zip(got["optimizer"]["state"].values(), want["optimizer"]["state"].values())
    assert all(torch.equal(a["momentum_buffer"], b["momentum_buffer"]) for a, b in momenta)
    assert processes_with_token(token) == [], "processes left behind"
