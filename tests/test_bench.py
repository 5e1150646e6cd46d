"""weft-bench: quick sweeps through the command line (python -m weft.bench), checking the
table, the JSON fields docs/benchmark.md documents, the CSV, the PNG, skipped peers and --algo."""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

OPS = ["all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "all_to_all"]
QUICK = ["-b", "64", "-e", "4K", "-f", "64", "-n", "2", "-w", "1"]
# The JSON fields documented in docs/benchmark.md.
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
    "iters",
    "time_us",
    "algbw_GBps",
    "busbw_GBps",
    "wrong",
    "time_us_runs",
    "cpu_us",
    "cpu_sys_us",
}
RATIO_FIELDS = {"op", "bytes", "in_place", "system", "peer", "ratio"}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def bench(*args, env=None, launcher=(sys.executable, "-m", "weft.bench"), timeout=240, ok=True):
    run_env = {**os.environ, **(env or {})}
    for var in ("WEFT_ALGO", "WEFT_TRANSPORT", "RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK"):
        if env is None or var not in env:
            run_env.pop(var, None)
    proc = subprocess.run(
        [*launcher, *args], env=run_env, capture_output=True, text=True, timeout=timeout
    )
    if ok:
        assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-4000:]}"
    return proc


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """Every op, weft against gloo, with MPI (both variants) made unavailable by a missing
    mpirun."""
    out = tmp_path_factory.mktemp("bench")
    files = {"json": out / "r.json", "csv": out / "r.csv", "plot": out / "r.png"}
    proc = bench(
        *QUICK,
        "-o",
        "all",
        "--vs",
        "gloo,mpi,mpi-tcp",
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
    for s in report["systems"]:
        # weft's buffering, which topo.simulate needs to run the Plans it ran; peers say none.
        if s["kind"] == "weft":
            held = s["buffering"]
            assert set(held) == {"slice_bytes", "step_bytes"} and min(held.values()) > 0, s
        else:
            assert "buffering" not in s, s
    for r in report["results"]:
        # weft says which family ran wherever its tuner chooses one (all_to_all has one).
        says = r["system"] == "weft" and r["op"] != "all_to_all"
        chosen = {"algorithm_runs", "trial_calls_runs"}
        assert set(r) == RECORD_FIELDS | (chosen if says else set()), r
    assert report["ratios"] and all(set(q) == RATIO_FIELDS for q in report["ratios"])
    assert {(q["system"], q["peer"]) for q in report["ratios"]} == {("weft", "gloo")}


def test_cpu_time_is_reported_with_the_kernels_part(sweep):
    proc, files = sweep
    for r in json.loads(files["json"].read_text())["results"]:
        assert 0 < r["cpu_us"] and 0 <= r["cpu_sys_us"] <= r["cpu_us"], r
    assert "all_reduce, in-place: CPU time per call over all ranks" in proc.stdout


def test_cpu_time_fits_in_the_machines_cores(tmp_path):
    """Every rank's CPU time per call, summed, lies between half the call's time (weft's
    ranks poll while they wait, so at least one is on a CPU throughout) and what the CPUs this
    process may use could give in it (with a margin for the ranks' blocks not starting
    together). Blocks of 50 calls: in blocks of 2 the clock reads alone added microseconds."""
    out = tmp_path / "r.json"
    bench(
        *("-o", "all_reduce", "-b", "64", "-e", "64K", "-f", "32", "-n", "100", "-w", "5"),
        *("--rounds", "2", f"--json={out}"),
    )
    cpus = len(os.sched_getaffinity(0))
    for r in json.loads(out.read_text())["results"]:
        assert 0.5 * r["time_us"] <= r["cpu_us"] <= 1.5 * cpus * r["time_us"], r


def test_cpu_time_is_the_sum_over_ranks_the_mean_over_blocks_and_the_median_launch():
    from weft.bench.results import combine_ranks, finish

    def rank(scale, *blocks):
        record = {
            "op": "all_reduce",
            "bytes": 8,
            "count": 2,
            "in_place": True,
            "iters": 6,
            "wrong": 0,
            "time_s": 1.0,
            "round_cpu_s": [[x * scale for x in b] for b in blocks],
        }
        return {"records": [record], "refused": {}, "unsupported": []}

    def launch(scale):
        # Per block, (all, the kernel's): block sums 3, 5 and 10 (their median would be 5).
        one = rank(scale, (1.0, 0.5), (3.0, 1.0), (9.0, 2.0))
        other = rank(scale, (2.0, 0.0), (2.0, 0.5), (1.0, 1.0))
        return combine_ranks([one, other])

    first = launch(1)
    assert first["records"][0]["round_cpu_s"] == [[3.0, 0.5], [5.0, 1.5], [10.0, 3.0]]
    # Launches of 6, 12 and 60 s per call (a mean over blocks): the median launch gives both.
    [record] = finish("weft", [launch(10), first, launch(2)], {"dtype": "float", "root": 0}, 2)
    assert record["cpu_us"] == pytest.approx(12e6)
    assert record["cpu_sys_us"] == pytest.approx(10e6 / 3, rel=1e-3)  # 4 digits


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
    """MPI cannot run: mpirun is missing (and mpi4py too, where the test command did not
    install it); the skip says which."""
    proc, files = sweep
    systems = {s["name"]: s for s in json.loads(files["json"].read_text())["systems"]}
    has_mpi4py = importlib.util.find_spec("mpi4py") is not None
    why = "no-such-mpirun not found" if has_mpi4py else "mpi4py is not installed"
    for name in ("mpi", "mpi-tcp"):
        assert systems[name]["status"] == "skipped"
        assert why in systems[name]["reason"]
        assert re.search(rf"^# {name}: skipped: .*{why}", proc.stdout, re.M)


@pytest.mark.skipif(
    shutil.which("mpirun") is None or importlib.util.find_spec("mpi4py") is None,
    reason="needs OpenMPI's mpirun and mpi4py (make install-peers)",
)
def test_mpi_tcp_runs_openmpi_over_tcp_alone(tmp_path):
    """mpi-tcp is OpenMPI limited to its tcp component: it runs, is right, and the report
    says how it was held to tcp."""
    out = tmp_path / "r.json"
    bench(*QUICK, "-o", "all_reduce", "--vs", "mpi-tcp", f"--json={out}")
    report = json.loads(out.read_text())
    system = next(s for s in report["systems"] if s["name"] == "mpi-tcp")
    assert system["status"] == "ok" and system["kind"] == "mpi"
    assert system["env"] == {"OMPI_MCA_pml": "ob1", "OMPI_MCA_btl": "tcp,self"}
    assert "Open MPI" in system["library"]
    mine = [r for r in report["results"] if r["system"] == "mpi-tcp"]
    assert mine and all(r["wrong"] == 0 for r in mine)


def allreduce_algorithms(stderr: str) -> set[str]:
    """The algorithms WEFT_DEBUG=INFO says the allreduce calls ran with."""
    return set(re.findall(r"allreduce: .*algorithm (\w+)", stderr))


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


def test_algorithms_share_a_launch(tmp_path):
    """Several --algo run in one launch, each on its own communicator, taking turns at each
    size; each is honoured and reported under its own name."""
    out = tmp_path / "r.json"
    proc = bench(
        *("-b", "8", "-e", "64K", "-f", "8192", "-n", "2", "-w", "1"),
        *("--algo", "ring,oneshot", f"--json={out}"),
        env={"WEFT_DEBUG": "INFO"},
    )
    assert allreduce_algorithms(proc.stderr) == {"ring", "oneshot"}
    # Turns at each size: rank 0 runs ring, oneshot, ring, oneshot (separate launches would
    # run ring twice, then oneshot twice); INFO names each size's algorithm at its first call.
    ran = re.findall(r"^weft\[rank 0\] allreduce: .*algorithm (ring|oneshot)", proc.stderr, re.M)
    turns = [a for i, a in enumerate(ran) if i == 0 or a != ran[i - 1]]
    assert turns == ["ring", "oneshot", "ring", "oneshot"]
    results = json.loads(out.read_text())["results"]
    for name in ("weft[ring]", "weft[oneshot]"):
        mine = [r for r in results if r["system"] == name]
        assert {r["bytes"] for r in mine} == {8, 65536} and all(r["wrong"] == 0 for r in mine)


def test_report_records_what_auto_ran(tmp_path):
    """algorithm_runs holds, per size, the family each launch's tuner chose, as its debug log
    says."""
    out = tmp_path / "r.json"
    proc = bench(
        *("-b", "8", "-e", "64K", "-f", "8192", "-n", "2", "-w", "1", "--repeats", "2"),
        f"--json={out}",
        env={"WEFT_DEBUG": "INFO"},
    )
    logged: dict[int, set[str]] = {}
    for nbytes, algorithm in re.findall(
        r"^weft\[rank 0\] allreduce of (\d+) bytes: algorithm (\w+)", proc.stderr, re.M
    ):
        logged.setdefault(int(nbytes), set()).add(algorithm)
    results = json.loads(out.read_text())["results"]
    assert {r["bytes"] for r in results} == {8, 65536}
    for r in results:
        assert len(r["algorithm_runs"]) == 2, r
        assert set(r["algorithm_runs"]) <= logged[r["bytes"]], (r, logged)


def test_the_table_says_what_auto_ran_where_it_varies():
    from weft.bench.report import chosen_algorithms

    def runs(nbytes, *algorithms):
        return {"bytes": nbytes, "in_place": True, "algorithm_runs": list(algorithms)}

    assert chosen_algorithms([runs(16, "rd", "rd"), runs(64, "rd", "hier")]) == [
        "# algorithm: 16 rd, 64 rd/hier"
    ]
    assert chosen_algorithms([runs(16, "ring", "ring"), runs(64, "ring", "ring")]) == []


def test_iter_bytes_times_more_calls_at_small_sizes(tmp_path):
    out = tmp_path / "r.json"
    sweep_args = ("-b", "8", "-e", "64K", "-f", "8", "-n", "2", "-w", "1")
    proc = bench(*sweep_args, "--iter-bytes", "64K", f"--json={out}")
    assert "-n 2 --iter-bytes 64 KiB" in proc.stdout
    iters = {r["bytes"]: r["iters"] for r in json.loads(out.read_text())["results"]}
    # Up to 512 B the cap (20 x -n); 4 KiB: 64 KiB / 4 KiB calls; 32 KiB: -n.
    assert iters == {8: 40, 64: 40, 512: 40, 4096: 16, 32768: 2}


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
    # Several algorithms share the launcher's processes, each on its own communicator.
    proc = bench(*QUICK, "--algo", "ring,rd", launcher=(*torchrun, "-m", "weft.bench"))
    assert proc.stdout.count("# weft[ring]: all_reduce") == 1
    assert proc.stdout.count("# weft[rd]: all_reduce") == 1
    refused = bench(
        *QUICK, "--transport", "shm,tcp", launcher=(*torchrun, "-m", "weft.bench"), ok=False
    )
    assert refused.returncode != 0
    assert "one --transport per run" in refused.stderr


def test_algo_all_under_a_launcher_spanning_hosts_includes_hier():
    """Ranks started by hand (RANK/WORLD_SIZE, as a launcher sets them) on two host identities:
    --algo all then lists the families of a two-host world, hier among them."""
    from weft.local import free_port

    port = free_port()
    base = {k: v for k, v in os.environ.items() if not k.startswith(("WEFT_", "OMPI_"))}
    base.update(WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    argv = [sys.executable, "-m", "weft.bench", *QUICK, "-o", "all_reduce", "--algo", "all"]
    procs = [
        subprocess.Popen(
            argv,
            env={**base, "RANK": str(r), "WEFT_HOST_ID": f"bench-host-{r}"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(2)
    ]
    try:
        outs = [p.communicate(timeout=240) for p in procs]
    finally:
        for p in procs:
            p.kill()
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, f"exit {p.returncode}\n{err[-4000:]}"
    assert "# weft[hier]: all_reduce" in outs[0][0], outs[0][0]
    assert "# weft[ring]: all_reduce" in outs[0][0]


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


COST_MODEL_FIELDS = {
    "shm_alpha_s",
    "shm_beta_s_per_b",
    "tcp_alpha_s",
    "tcp_beta_s_per_b",
    "gamma_s_per_b",
}
# What the thorough probe adds: betas for buffers past the caches, and the two sizes.
LARGE_BUFFER_FIELDS = {
    "small_bytes",
    "large_bytes",
    "shm_beta_large_s_per_b",
    "tcp_beta_large_s_per_b",
}
PRINT_COST_MODEL = (
    "import torch.distributed as dist, weft\n"
    "print(weft.Communicator(dist.HashStore(), 0, 1).cost_model, end='')"
)


def cost_model_with(tune: str) -> subprocess.CompletedProcess:
    """A fresh process's communicator, given WEFT_TUNE=tune (read once per process)."""
    env = {**os.environ, "WEFT_TUNE": tune}
    return subprocess.run(
        [sys.executable, "-c", PRINT_COST_MODEL], env=env, capture_output=True, text=True
    )


def test_tune_writes_a_cost_model_that_weft_tune_loads(tmp_path):
    path = tmp_path / "model.txt"
    proc = bench("--tune", str(path), "--np", "2")
    assert f"WEFT_TUNE={path}" in proc.stdout
    text = path.read_text()
    assert "# measured: shm, tcp" in text
    values = {
        k: float(v) for k, v in (line.split() for line in text.splitlines() if line[:1] != "#")
    }
    assert set(values) == COST_MODEL_FIELDS | LARGE_BUFFER_FIELDS
    assert all(v > 0 for v in values.values())
    assert (values["small_bytes"], values["large_bytes"]) == (4 << 20, 64 << 20)
    # Measured, not the built-in figures. (Which link comes out faster depends on where the
    # scheduler put each launch's two ranks: sharing a core, shm pings cost a context switch.)
    builtin = dict(line.split() for line in cost_model_with("off").stdout.splitlines())
    assert all(values[k] != float(builtin[k]) for k in COST_MODEL_FIELDS), (values, builtin)
    # A communicator takes the file as it is, comments and all.
    loaded = cost_model_with(str(path))
    assert loaded.returncode == 0, loaded.stderr
    model = [line for line in text.splitlines() if line[:1] != "#"]
    assert loaded.stdout.splitlines() == model


def test_weft_tune_names_what_is_wrong_with_a_file(tmp_path):
    missing = cost_model_with(str(tmp_path / "none.txt"))
    assert "no such file" in missing.stderr and "weft-bench --tune" in missing.stderr
    bad = tmp_path / "bad.txt"
    bad.write_text("# a model\nshm_alpha_s 1e-6 extra\n")
    assert "bad.txt', line 2: expected 'name value'" in cost_model_with(str(bad)).stderr
    partial = tmp_path / "partial.txt"
    partial.write_text("shm_alpha_s 1e-6\n")
    assert "needs a positive shm_beta_s_per_b" in cost_model_with(str(partial)).stderr
    # off: the built-in figures.
    builtin = cost_model_with("off")
    assert builtin.returncode == 0 and "shm_alpha_s 2e-06" in builtin.stdout


def test_rounds_split_the_timed_calls_and_report_the_median_block(tmp_path):
    """--rounds 3: each variant's timed calls in 3 blocks, taken in turns; the launch's time
    is the median block, each block its slowest rank's."""
    out = tmp_path / "r.json"
    proc = bench(
        *("-b", "1K", "-e", "1K", "-n", "5", "-w", "1", "--rounds", "3", "--np", "3"),
        *("--algo", "ring,tree", f"--json={out}"),
    )
    assert "rounds 3, repeats 1" in proc.stdout
    report = json.loads(out.read_text())
    assert report["config"]["rounds"] == 3
    for r in report["results"]:
        [blocks] = r["time_us_rounds"]
        assert len(blocks) == 3 and r["iters"] == 6, r  # 2 calls a block
        assert r["time_us"] == pytest.approx(sorted(blocks)[1], rel=1e-3), r


def test_a_rounds_time_is_its_slowest_rank():
    from weft.bench.results import combine_ranks

    def rank(*blocks):
        record = {"op": "all_reduce", "wrong": 0, "time_s": 0, "round_times_s": list(blocks)}
        record["round_cpu_s"] = [[0.0, 0.0]] * len(blocks)
        return {"records": [record], "refused": {}, "unsupported": []}

    [record] = combine_ranks([rank(1.0, 5.0, 2.0), rank(3.0, 1.0, 2.5)])["records"]
    assert record["round_times_s"] == [3.0, 5.0, 2.5]
    assert record["time_s"] == 3.0


def test_plan_and_msccl_files_run_beside_the_builtins(tmp_path):
    """--plan and --msccl: an Algorithm file measured (and checked, -c) in the launch of the
    built-in it copies; --np defaults to the file's ranks; a broken file stops the run with the
    reason."""
    from test_topo_msccl import ring_xml
    from weft import topo

    path = tmp_path / "ring3.json"
    topo.builtin("allreduce", "ring", 3, count=4).save(path)
    out = tmp_path / "r.json"
    bench("--plan", str(path), "--algo", "ring", "--transport", "shm", *QUICK, f"--json={out}")
    report = json.loads(out.read_text())
    assert report["config"]["world_size"] == 3
    by_system = {}
    for r in report["results"]:
        by_system.setdefault(r["system"], []).append(r)
    plan_records = by_system["weft-shm[json:ring]"]
    assert {r["bytes"] for r in plan_records} == {r["bytes"] for r in by_system["weft-shm[ring]"]}
    assert all(r["wrong"] == 0 and r["op"] == "all_reduce" for r in plan_records)
    xml = tmp_path / "ring3.xml"
    xml.write_text(ring_xml(3))
    out = tmp_path / "m.json"
    # Sizes of whole multiples of its 3 chunks (3 and 768 floats); in place, as it is written.
    sizes = ["-b", "12", "-e", "3072", "-f", "256", "-n", "2", "-w", "1"]
    bench("--msccl", str(xml), "--transport", "shm", *sizes, f"--json={out}")
    report = json.loads(out.read_text())
    assert report["config"]["world_size"] == 3
    msccl_records = [r for r in report["results"] if r["system"] == "weft-shm[msccl:ring3]"]
    assert {(r["bytes"], r["in_place"]) for r in msccl_records} == {(12, True), (3072, True)}
    assert all(r["wrong"] == 0 for r in msccl_records), msccl_records
    (tmp_path / "bad.json").write_text('{"format": "weft-algorithm/1"}')
    proc = bench("--plan", str(tmp_path / "bad.json"), *QUICK, ok=False)
    assert proc.returncode != 0 and "bad.json" in proc.stderr


def test_channels_make_variants_of_one_launch(tmp_path):
    out = tmp_path / "r.json"
    bench("--algo", "tree", "--channels", "1,2", "--transport", "shm", *QUICK, f"--json={out}")
    names = {r["system"] for r in json.loads(out.read_text())["results"]}
    assert names == {"weft-shm[tree,1ch]", "weft-shm[tree,2ch]"}


def rooted_files(tmp_path) -> dict:
    """MSCCL files on 3 ranks: a broadcast from rank 1 (out of place and in place), an
    in-place reduce into rank 1 that leaves its root open (rank 0 writes its buffer too), a
    reduce into rank 2 and an allreduce; and a JSON broadcast from rank 2."""
    from test_topo_msccl import chain_reduce_xml, open_root_reduce_xml, ring_xml, tree_broadcast_xml
    from weft import topo

    texts = {
        "bcast": tree_broadcast_xml(3, 1),
        "bcast_in_place": tree_broadcast_xml(3, 1, in_place=True),
        "open": open_root_reduce_xml(3),
        "reduce": chain_reduce_xml(3, 2),
        "ring": ring_xml(3),
    }
    paths = {name: tmp_path / f"{name}.xml" for name in texts}
    for name, text in texts.items():
        paths[name].write_text(text)
    paths["plan"] = tmp_path / "bcast.json"
    topo.builtin("broadcast", "tree", 3, root=2, count=3).save(paths["plan"])
    return {name: str(path) for name, path in paths.items()}


def test_a_rooted_file_sets_the_runs_root_and_r_must_match_it(tmp_path, monkeypatch):
    """A broadcast's or reduce's --msccl or --plan file is for one root: without -r every
    system measures at it; -r must name it (an in-place reduce that leaves its root open is
    loaded with -r's, and refused without); files for two roots are refused."""
    from weft.bench import cli, lineup

    f = rooted_files(tmp_path)

    def roots(*argv):
        args = cli.parse_args(list(argv))
        files = lineup.algorithm_files(args.plan, args.msccl, args.root)
        return lineup.run_root(args.root, files), [spec["root"] for spec in files]

    assert roots() == (0, []) and roots("-r", "2") == (2, [])
    assert roots("--msccl", f["bcast"], "--msccl", f["ring"]) == (1, [1, None])
    assert roots("--msccl", f["bcast"], "-r", "1") == (1, [1])
    assert roots("--msccl", f["open"], "-r", "0") == (0, [0])
    assert roots("--plan", f["plan"]) == (2, [None])
    for argv, message in (
        (
            ["--msccl", f["bcast"], "-r", "2"],
            "tree_bcast3 is for root 1, but -r 2 was given: leave",
        ),
        (["--plan", f["plan"], "-r", "1"], "tree is for root 2, but -r 1 was given"),
        (["--msccl", f["open"]], "the in-place reduce's root is ambiguous: give root= \\(-r R\\)"),
        (["--msccl", f["open"], "-r", "2"], "root=2 contradicts the program: rank 2 never writes"),
        (["--msccl", f["bcast"], "--msccl", f["reduce"]], "for different roots .* a run measures"),
    ):
        with pytest.raises(SystemExit, match=message):
            roots(*argv)
    for var in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(SystemExit, match="is for root 1, but -r 0 was given"):
        cli.main(["--msccl", f["bcast"], "-r", "0"])  # refused before anything launches


def case_measure_at_root(ctx, path: str, root: int, spec_root: int) -> tuple:
    """The file's WeftAlgorithm (loaded with ``spec_root``) measured at ``root`` with -c as
    weft-bench measures it: ((op, in place, #wrong) per record, notes, refusals)."""
    from weft.bench.systems import WeftAlgorithm
    from weft.bench.timing import run_plan

    name = ctx.fresh_name("bench-rooted")
    spec = {"path": path, "format": "msccl", "name": name, "root": spec_root}
    system = WeftAlgorithm(ctx.rank, ctx.size, ctx.store, spec)
    op = "broadcast" if system.algo.collective == "broadcast" else "reduce"
    plan = {"sizes": [48], "dtype": "float", "iters": 1, "rounds": 1, "warmup": 0}
    plan.update(check=True, root=root, ops=[op])
    out = run_plan({name: (system, [op])}, plan, ctx.rank, ctx.size, lambda: None)[name]
    records = [(r["op"], r["in_place"], r["wrong"]) for r in out["records"]]
    return records, out["unsupported"], out["refused"]


def test_rooted_msccl_files_are_measured_at_their_root(tmp_path, pools):
    """A broadcast (out of place or in place: weft's has no input, so the bench's one buffer
    serves both) and an open-root reduce loaded with its -r run right at that root; at another
    root the file's system measures nothing and says why."""
    f = rooted_files(tmp_path)
    pool = pools.get(3, "shm")
    for path, root in ((f["bcast"], 1), (f["bcast_in_place"], 1), (f["open"], 1)):
        op = "reduce" if path == f["open"] else "broadcast"
        for records, _, refused in pool.run(case_measure_at_root, path, root, root):
            assert records == [(op, True, 0)] and not refused, (path, records, refused)
    for records, notes, _ in pool.run(case_measure_at_root, f["bcast"], 0, 1):
        assert records == [] and notes == ["tree_bcast3 is for root 1, not 0"], notes
