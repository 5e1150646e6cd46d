"""torchrun and a killed worker (issue 45, item 10), without restarts: with a weft process
group of timeout T, SIGKILLing one worker in the middle of its allreduces makes the job exit
non-zero within T + 5 s, leaving no process behind. (The --max-restarts case, resuming the
DDP example from a checkpoint, is not written yet.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import weft.local
from weft_proc import TOKEN_VAR, processes_with_token

TESTS = Path(__file__).resolve().parent
T_S = 10.0
WORKERS = 3


def test_a_killed_worker_ends_the_job_within_the_timeout(tmp_path):
    token = uuid.uuid4().hex
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(WORKERS),
            "--max-restarts", "0", "--master-port", str(weft.local.free_port()),
            str(TESTS / "torchrun_loop.py"), str(tmp_path), str(T_S), "120"]  # fmt: skip
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
        os.kill(pids["rank1"], signal.SIGKILL)
        killed = time.monotonic()
        rc = job.wait(T_S + 30)
        took = time.monotonic() - killed
        output = job.stdout.read().decode(errors="replace")
    finally:
        if job.poll() is None:
            job.kill()
            job.wait(10)
    assert rc != 0, output[-3000:]
    assert took < T_S + 5, f"the job took {took:.1f} s to end after the kill\n{output[-3000:]}"
    time.sleep(0.5)
    assert processes_with_token(token) == [], "processes left behind"
