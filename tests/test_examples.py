"""Every example under examples/ runs as its docstring says (torchrun on local ranks, or plain
python) and checks its own results; the README's Python snippets are cut from these files
(test_docs.py). train_digits.py has its own, longer test in test_ddp.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import doc_checks
import pytest
import weft

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = [p for p in sorted((ROOT / "examples").rglob("*.py")) if p.name != "train_digits.py"]


def launch_argv(command: list[str]) -> list[str]:
    """The docstring's command with this interpreter, and torchrun on a free port."""
    if command[0] == "torchrun":
        port = str(weft.local.free_port())
        return [sys.executable, "-m", "torch.distributed.run", "--master-port", port, *command[1:]]
    return [sys.executable, *command[1:]]


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_example_runs_as_its_docstring_says(example):
    command = doc_checks.example_command(example, example.relative_to(ROOT).as_posix())
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        launch_argv(command), cwd=ROOT, env=env, capture_output=True, text=True, timeout=180
    )
    assert proc.returncode == 0, f"{' '.join(command)}:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
    if command[0] == "torchrun":
        ranks = int(command[command.index("--nproc-per-node") + 1])
        done = sorted(int(r) for r in re.findall(r"rank (\d+): ok", proc.stdout))
        assert done == list(range(ranks)), proc.stdout
