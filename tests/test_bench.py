"""weft-bench: quick sweeps through the command line (python -m weft.bench), checking the
table, the JSON fields the README documents, the CSV, the PNG, skipped peers and --algo."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys

import pytest

OPS = ["all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "all_to_all"]
QUICK = ["-b", "64", "-e", "4K", "-f", "64", "-n", "2", "-w", "1"]
# The JSON fields documented in the README.
TOP_FIELDS = {"format", "command", "machine", "config", "systems", "results", "ratios"}
SYSTEM_FIELDS = {"name", "kind", "env", "status", "reason"}
RECORD_FIELDS = {
    "system",
    "op",
    "bytes",
    "count",
    "dtype",
    "redop",
    "root",
    "in_place",
    "time_us",
    "algbw_GBps",
    "busbw_GBps",
    "wrong",
    "time_us_runs",
}
RATIO_FIELDS = {"op", "bytes", "in_place", "system", "peer", "ratio"}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def bench(*args, env=None, launcher=(sys.executable, "-m", "weft.bench"), timeout=240):
    run_env = {**os.environ, **(env or {})}
    for var in ("WEFT_ALGO", "WEFT_TRANSPORT", "RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK"):
        if env is None or var not in env:
            run_env.pop(var, None)
    proc = subprocess.run(
        [*launcher, *args], env=run_env, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-4000:]}"
    return proc


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """Every op, weft against gloo, with MPI made unavailable by a missing mpirun."""
    out = tmp_path_factory.mktemp("bench")
    files = {"json": out / "r.json", "csv": out / "r.csv", "plot": out / "r.png"}
    proc = bench(
        *QUICK,
        "-o",
        "all",
        "--vs",
        "gloo,mpi",
        "--mpirun",
        str(out / "no-such-mpirun"),
        *(f"--{k}={v}" for k, v in files.items()),
    )
    return proc, {k: v for k, v in files.items()}


def test_every_op_runs_and_checks_out(sweep):
    proc, files = sweep
    report = json.loads(files["json"].read_text())
    for system in ("weft", "gloo"):
        ops = {r["op"] for r in report["results"] if r["system"] == system}
        assert ops == set(OPS), f"{system} measured {sorted(ops)}"
    assert all(r["wrong"] == 0 for r in report["results"])
    assert all(r["time_us"] > 0 and r["busbw_GBps"] > 0 for r in report["results"])
    for op in OPS:
        assert f"# weft: {op}" in proc.stdout
    assert "# Out of bounds values : 0 OK" in proc.stdout


def test_json_has_the_documented_fields(sweep):
    _, files = sweep
    report = json.loads(files["json"].read_text())
    assert set(report) == TOP_FIELDS
    assert report["format"] == "weft-bench/1"
    assert report["config"]["world_size"] == 2
    assert all(SYSTEM_FIELDS <= set(s) for s in report["systems"])
    assert all(set(r) == RECORD_FIELDS for r in report["results"])
    assert report["ratios"] and all(set(q) == RATIO_FIELDS for q in report["ratios"])
    assert {(q["system"], q["peer"]) for q in report["ratios"]} == {("weft", "gloo")}


def test_busbw_follows_nccl_tests(sweep):
    _, files = sweep
    factors = {"all_reduce": 1.0, "reduce_scatter": 0.5, "all_gather": 0.5, "all_to_all": 0.5}
    for r in json.loads(files["json"].read_text())["results"]:
        want = r["algbw_GBps"] * factors.get(r["op"], 1.0)
        assert r["busbw_GBps"] == pytest.approx(want, rel=1e-3), r
        assert r["algbw_GBps"] == pytest.approx(r["bytes"] / r["time_us"] / 1e3, rel=1e-3), r


def test_csv_and_png(sweep):
    _, files = sweep
    with files["csv"].open() as f:
        rows = list(csv.DictReader(f))
    assert rows and {"system", "op", "bytes", "busbw_GBps", "wrong"} <= set(rows[0])
    assert files["plot"].read_bytes()[:8] == PNG_MAGIC


def test_missing_peer_is_skipped_with_the_reason(sweep):
    proc, files = sweep
    systems = {s["name"]: s for s in json.loads(files["json"].read_text())["systems"]}
    assert systems["mpi"]["status"] == "skipped"
    assert "no-such-mpirun not found" in systems["mpi"]["reason"]
    assert re.search(r"^# mpi: skipped: .*no-such-mpirun not found", proc.stdout, re.M)


def allreduce_algorithms(stderr: str) -> set[str]:
    """The algorithms WEFT_DEBUG=INFO says the allreduce calls ran with."""
    return set(re.findall(r"allreduce #\d+: .*algorithm (\w+)", stderr))


@pytest.mark.parametrize(
    "algo, size",
    [("ring", "8"), ("oneshot", "64K")],  # each where the automatic choice is the other one
)
def test_algo_is_honoured(algo, size):
    proc = bench(
        "-b", size, "-e", size, "-n", "2", "-w", "1", "--algo", algo, env={"WEFT_DEBUG": "INFO"}
    )
    assert allreduce_algorithms(proc.stderr) == {algo}
    assert f"# weft[{algo}]: all_reduce" in proc.stdout


def test_algo_all_draws_one_line_per_algorithm_and_refusals_are_clear(tmp_path):
    out = tmp_path / "r.json"
    proc = bench(*QUICK, "-o", "all_reduce,broadcast", "--algo", "all", f"--json={out}")
    report = json.loads(out.read_text())
    measured = {(r["system"], r["op"]) for r in report["results"]}
    allreduce = {"ring", "tree", "rd", "rhd", "oneshot"}
    broadcast = {"chain", "tree"}
    assert measured == {(f"weft[{a}]", "all_reduce") for a in allreduce} | {
        (f"weft[{a}]", "broadcast") for a in broadcast
    }
    # A named algorithm that does not apply to an op: weft's own error, the op not run.
    proc = bench(*QUICK, "-o", "all_reduce,broadcast", "--algo", "ring")
    assert "# weft[ring]: all_reduce" in proc.stdout
    assert re.search(r"# weft\[ring\]: broadcast: not run: WEFT_ALGO=ring .*chain", proc.stdout)


def test_under_torchrun_it_uses_the_launchers_ranks():
    torchrun = (sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2")
    proc = bench(*QUICK, "--vs", "gloo", launcher=(*torchrun, "-m", "weft.bench"))
    assert "2 ranks (torchrun)" in proc.stdout
    assert proc.stdout.count("# weft: all_reduce") == 1  # rank 0 alone reports
    assert "# gloo: all_reduce" in proc.stdout


def test_progress_bar_follows_the_ranks_steps(monkeypatch):
    """The bar shows on a terminal and counts the steps rank 0 reports, launch after launch."""
    import io
    import time

    from weft.bench.progress import Progress, step_writer

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    progress = Progress(4)
    for name in ("weft", "gloo"):
        step = step_writer(progress.launch(name, 2))
        step()
        step()
        time.sleep(0.5)  # the bar polls every 0.2 s
    progress.close()
    assert "gloo: 100%" in terminal.getvalue()
    assert "4/4" in terminal.getvalue()


def test_progress_bar_is_quiet_off_a_terminal(monkeypatch):
    import io

    from weft.bench.progress import Progress

    pipe = io.StringIO()
    monkeypatch.setattr(sys, "stderr", pipe)
    Progress(4).close()
    assert pipe.getvalue() == ""
