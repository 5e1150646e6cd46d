"""Ranks on namespace "hosts" (weft.netns.Hosts): each rank a script that prints one JSON
report as its last line of output."""

from __future__ import annotations

import json
import subprocess


def reports(net, per_host: int, argvs: list[list[str]], env: dict, timeout: float) -> list:
    """Runs argvs[rank] on host rank // per_host, waits for all (bounded by `timeout`) and
    returns each rank's report; a rank that fails fails the test with its stderr."""
    procs = [
        net.spawn(rank // per_host, argv, env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for rank, argv in enumerate(argvs)
    ]
    outputs = [p.communicate(timeout=timeout) for p in procs]
    found = []
    for rank, (proc, (out, err)) in enumerate(zip(procs, outputs)):
        assert proc.returncode == 0, f"rank {rank} failed:\n{err.decode()[-3000:]}"
        found.append(json.loads(out.decode().strip().splitlines()[-1]))
    return found
