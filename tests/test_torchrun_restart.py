"""torchrun and a killed worker (issue 45, item 10). Without restarts: with a weft process
group of timeout T, SIGKILLing one worker in the middle of its allreduces makes the job exit
non-zero within T + 5 s, leaving no process behind. With --max-restarts 1: torchrun restarts
the group, whose new weft communicators bootstrap again, and a training loop resumes from its
checkpoint to the same weights as an uninterrupted run (computed here with torch alone)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import torch
import weft.local
from weft_proc import TOKEN_VAR, processes_with_token

TESTS = Path(__file__).resolve().parent
T_S = 10.0
WORKERS = 3


def run_and_kill(tmp_path, restarts: int, script: str, *args: str) -> tuple[int, float, str, str]:
    """Starts torchrun, SIGKILLs rank 1 once every worker wrote its pid; (exit code, seconds
    from the kill to the exit, output, token)."""
    token = uuid.uuid4().hex
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(WORKERS),
            "--max-restarts", str(restarts), "--master-port", str(weft.local.free_port()),
            str(TESTS / script), str(tmp_path), *args]  # fmt: skip
    env = {**os.environ, TOKEN_VAR: token, "OMP_NUM_THREADS": "1", "WEFT_TUNE": "off"}
    job = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        pids = {}
        while len(pids) < WORKERS and time.monotonic() < deadline and job.poll() is None:
            for f in tmp_path.glob("rank*.pid"):
                if f.read_text():
                    pids[f.stem] = int(f.read_text())
            time.sleep(0.05)
        assert len(pids) == WORKERS, f"workers never ran: {job.poll()}"
        for f in tmp_path.glob("rank*.pid"):
            f.unlink()
        os.kill(pids["rank1"], signal.SIGKILL)
        killed = time.monotonic()
        rc = job.wait(120)
        took = time.monotonic() - killed
        output = job.stdout.read().decode(errors="replace")
    finally:
        if job.poll() is None:
            job.kill()
            job.wait(10)
    return rc, took, output, token


def test_a_killed_worker_ends_the_job_within_the_timeout(tmp_path):
    rc, took, output, token = run_and_kill(tmp_path, 0, "torchrun_loop.py", str(T_S), "120")
    assert rc != 0, output[-3000:]
    assert took < T_S + 5, f"the job took {took:.1f} s to end after the kill\n{output[-3000:]}"
    time.sleep(0.5)
    assert processes_with_token(token) == [], "processes left behind"


STEPS = 300


def test_torchrun_restarts_the_group_and_training_resumes_from_its_checkpoint(tmp_path):
    import torchrun_resume as worker

    rc, _, output, token = run_and_kill(tmp_path, 1, "torchrun_resume.py", str(STEPS))
    assert rc == 0, output[-3000:]
    final = torch.load(tmp_path / "final.pt")
    assert 0 < final["resumed_from"] < STEPS, f"did not resume: {final['resumed_from']}"
    w = torch.zeros(64).double()
    for step in range(STEPS):
        g = sum(worker.gradient(r, step) for r in range(WORKERS))
        w -= worker.LR * g / WORKERS
    assert torch.allclose(final["w"], w, rtol=0, atol=1e-9), (final["w"] - w).abs().max()
    assert processes_with_token(token) == [], "processes left behind"
