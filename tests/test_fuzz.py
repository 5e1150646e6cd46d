"""A short run of every fuzz target (tests/fuzz/run.py: libFuzzer on the bootstrap's wire
parsers, the tcp and shared-memory transports' receiving sides, the RDMA protocol against a peer
played by the input, point-to-point's receiving side against peers' streams the input writes, and
the cost-model file, atheris
on weft.topo's JSON and MSCCL readers, Topology.load and the flight recorder's files). A target
whose tool is missing skips with the reason; one that finds a crash fails, naming the input it
left. The longer run's result is in bench/results/fuzz/ (docs/security.md)."""

from __future__ import annotations

import importlib.util
import tempfile
from pathlib import Path

import pytest

SECONDS = 5
spec = importlib.util.spec_from_file_location("fuzz_run", Path(__file__).parent / "fuzz" / "run.py")
fuzz_run = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fuzz_run)
# Binaries are cached by the content of their sources, corpora grow from run to run.
WORK = Path(tempfile.gettempdir()) / "weft-fuzz-ci"


@pytest.fixture(scope="module")
def results() -> dict:
    """Every target's run, two at a time (builds and runs each take a core)."""
    return fuzz_run.run_all(SECONDS, WORK, jobs=2)


@pytest.mark.parametrize("name", sorted(fuzz_run.CPP_TARGETS))
def test_libfuzzer_target_finds_no_crash(results, name):
    check(results[f"cpp:{name}"])


@pytest.mark.parametrize("kind", fuzz_run.PY_TARGETS)
def test_atheris_target_finds_no_crash(results, kind):
    check(results[f"atheris:topo_{kind}"])


def check(result: dict) -> None:
    if "skipped" in result:
        pytest.skip(result["skipped"])
    assert result["ok"], f"crashes {result['crashes']} under {WORK}/crashes:\n{result['tail']}"
    assert result["executions"] > 100 and result["coverage_edges"] > 0, result
