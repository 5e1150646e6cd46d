"""Creating weft process groups every way torch.distributed offers, in fresh processes: tcp://,
file://, env:// (by hand and under torchrun), an explicit store, and device-mixed backend
strings such as "cpu:weft,cuda:gloo"."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from weft.local import free_port
from weft_proc import Ranks

TESTS_DIR = Path(__file__).resolve().parent


def scenario_init_methods(rank, size, store, tcp_port, env_port, file_path):
    import torch
    import torch.distributed as dist
    import weft  # noqa: F401 - registers the backend

    results = {}

    def check(name, **kwargs):
        dist.init_process_group(rank=rank, world_size=size, **kwargs)
        t = torch.full((3,), float(rank + 1))
        dist.all_reduce(t)
        results[name] = [t.tolist(), str(dist.get_backend())]
        dist.destroy_process_group()

    check("tcp", backend="weft", init_method=f"tcp://127.0.0.1:{tcp_port}")
    check("file", backend="weft", init_method=f"file://{file_path}")
    check("store", backend="weft", store=dist.PrefixStore("explicit/", store))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(env_port))
    check("env", backend="weft")
    check("cpu:weft", backend="cpu:weft", store=dist.PrefixStore("mixed/", store))
    check("mix", backend="cpu:weft,cuda:gloo", store=dist.PrefixStore("mixed2/", store))
    return results


def test_init_methods(tmp_path):
    with Ranks(
        scenario_init_methods, 2, free_port(), free_port(), str(tmp_path / "rendezvous")
    ) as ranks:
        results = ranks.results(timeout=180)
    total = [3.0, 3.0, 3.0]
    for per_rank in results:
        assert per_rank == {
            "tcp": [total, "weft"],
            "file": [total, "weft"],
            "store": [total, "weft"],
            "env": [total, "weft"],
            "cpu:weft": [total, "cpu:weft"],
            "mix": [total, "cpu:weft,cuda:gloo"],
        }


def test_torchrun():
    """env:// as torchrun sets it up, with DDP on top."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WEFT_")}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node=2",
            str(TESTS_DIR / "torchrun_weft.py"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # The ranks share torchrun's stdout: their lines may run together.
    assert sorted(re.findall(r"rank \d/\d: \w+ ok", proc.stdout)) == [
        "rank 0/2: weft ok",
        "rank 1/2: weft ok",
    ], proc.stdout
