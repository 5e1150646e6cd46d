"""WEFT_ALGO=file:PATH: the torch backend runs a weft.topo Algorithm file for its collective,
against gloo on the same inputs under torchrun, at the sizes the file divides, and weft's own
choice elsewhere; a file that does not load stops the group with the reason; weft.Communicator
refuses file: and points to topo.run."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import weft
from weft import topo

TESTS_DIR = Path(__file__).parent


def torchrun(script: Path, ranks: int, algo: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WEFT_")}
    env["WEFT_ALGO"] = algo
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={ranks}",
            str(script),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_the_torch_backend_runs_the_file_against_gloo(tmp_path):
    path = tmp_path / "two_rings.json"
    # An in-place allreduce of 6 elements per rank on two channels, a ring each way (3 each).
    p = topo.Program("allreduce", ranks=3, count=6, name="two_rings", in_place=True)
    for r in range(3):
        for channel, direction in ((0, 1), (1, -1)):
            base = 0 if channel == 0 else 3
            nxt, prev = (r + direction) % 3, (r - direction) % 3

            def chunk(j, r=r, base=base, direction=direction):
                c = (r - j * direction) % 3
                return p.output[base + c : base + c + 1]

            p.send(r, to=nxt, src=chunk(0), channel=channel)
            p.recv_reduce_send(r, frm=prev, to=nxt, src=chunk(1), channel=channel)
            p.recv_reduce_copy_send(
                r, frm=prev, to=nxt, src=chunk(2), dst=chunk(2), channel=channel
            )
            p.recv_copy_send(r, frm=prev, to=nxt, dst=chunk(3), channel=channel)
            p.recv(r, frm=prev, dst=chunk(4), channel=channel)
    algo = p.algorithm()
    assert topo.check(algo).ok, topo.check(algo)
    algo.save(path)
    proc = torchrun(TESTS_DIR / "torchrun_file_algo.py", 3, f"file:{path}")
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    # 7 elements are not a whole multiple of the file's 6: weft's own choice there.
    ran = sorted(re.findall(r"rank (\d)/3: file ran at (\[[^\]]*\])", proc.stdout))
    assert ran == [(str(r), "[6, 6186, 24594]") for r in range(3)], proc.stdout


def test_the_torch_backend_runs_an_msccl_file(tmp_path):
    """MSCCL's XML by its suffix: an in-place ring of 3 chunks runs at the sizes 3 divides,
    against gloo."""
    from test_topo_msccl import ring_xml

    path = tmp_path / "ring3.xml"
    path.write_text(ring_xml(3))
    proc = torchrun(TESTS_DIR / "torchrun_file_algo.py", 3, f"file:{path}")
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    ran = sorted(re.findall(r"rank (\d)/3: file ran at (\[[^\]]*\])", proc.stdout))
    assert ran == [(str(r), "[6, 6186, 24594]") for r in range(3)], proc.stdout


def test_a_file_that_does_not_load_stops_the_group(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    proc = torchrun(TESTS_DIR / "torchrun_file_algo.py", 2, f"file:{bad}")
    assert proc.returncode != 0
    assert "WEFT_ALGO=file:" in proc.stderr and "bad.json" in proc.stderr


class NoStore:
    def set(self, key, value): ...

    def get(self, key): ...


def test_the_core_api_refuses_file():
    with pytest.raises(weft.InvalidArgument, match="topo.run"):
        weft.Communicator(NoStore(), 0, 1, algo="file:x")
