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


def test_a_file_that_leaves_its_root_open_runs_with_the_calls_root(tmp_path, caplog):
    """An in-place MSCCL reduce that several ranks write is loaded with each of them as root,
    and a call runs the one of its root (checked: a root the sums only pass through fails the
    checker, saying so); a call with a root none of them is takes weft's own choice, saying
    why, as a call does with another root than a file's own."""
    from test_topo_msccl import chain_reduce_xml, open_root_reduce_xml
    from weft.topo import file_algo

    path = tmp_path / "open.xml"
    path.write_text(open_root_reduce_xml(5))
    algos = file_algo.load_algorithms(f"file:{path}")
    assert {root: algo.root for root, algo in algos.items()} == {0: 0, 1: 1, 2: 2, 3: 3}
    source = file_algo.PlanSource(algos, rank=3)
    connections = (1 << 18, 8)  # slot_bytes, slots
    assert source(8, 4, 3, True, False, *connections)["steps"]
    caplog.set_level("INFO", logger="weft")
    assert source(8, 4, 4, True, False, *connections) is None
    assert "reduce of 8 elements takes weft's own choice: its root is 0, 1, 2 or 3" in caplog.text
    with pytest.raises(topo.AlgorithmError, match="fails the checker at 8 elements with root 1"):
        source(8, 4, 1, True, False, *connections)
    path.write_text(chain_reduce_xml(5, 3, in_place=True))
    named = file_algo.PlanSource(file_algo.load_algorithms(f"file:{path}"), rank=3)
    assert list(named.algos) == [3]
    assert named(8, 4, 2, True, False, *connections) is None
    assert "takes weft's own choice: its root is 3" in caplog.text
