"""The folders of csrc/ are layers, and each includes only the layers below it (docs/design.md
draws them). The GPU collectives bootstrap through the Communicator, so device/ sits above
comm.*; nothing in transport/ may include comm.h; the core never includes torch."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CSRC = ROOT / "csrc"

# Bottom up; a layer may include its own files and those of lower layers. exec/ and tune/ sit
# side by side and include neither each other.
LAYERS = {
    "core/common": 0,
    "core/reduce": 1,
    "core/bootstrap": 2,
    "core/transport": 3,
    "core/algo": 4,
    "core/exec": 5,
    "core/tune": 5,
    "core/sim": 5,
    "core/comm": 6,
    "core/device": 7,
    "python": 8,
    "torch": 9,
}
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^">]+)[">]', re.MULTILINE)
TORCH_HEADERS = ("torch/", "c10/", "ATen/", "pybind11/", "Python.h")


def layer_of(path: str) -> str | None:
    """The layer of a path relative to csrc/ ("core/comm.h" -> "core/comm")."""
    parts = path.split("/")
    if parts[0] == "core" and len(parts) > 1:
        return "core/comm" if parts[1].startswith("comm.") else f"core/{parts[1]}"
    return parts[0] if parts[0] in LAYERS else None


def sources() -> list[Path]:
    return sorted(p for p in CSRC.rglob("*") if p.suffix in (".cc", ".h", ".cu"))


def layering_violations(files: list[Path], csrc: Path) -> list[str]:
    problems = []
    for path in files:
        own = layer_of(str(path.relative_to(csrc)))
        if own not in LAYERS:
            problems.append(f"{path.relative_to(csrc)}: in no layer; add its folder to LAYERS")
            continue
        for delimiter, header in INCLUDE.findall(path.read_text()):
            if delimiter == "<":  # a system or third-party header
                if own.startswith("core/") and header.startswith(TORCH_HEADERS):
                    problems.append(
                        f"{path.relative_to(csrc)} includes {header}: core is torch-free"
                    )
                continue
            target = layer_of(header)  # None: a header beside the file ("buffer.h")
            if target and target != own and LAYERS.get(target, len(LAYERS)) >= LAYERS[own]:
                problems.append(f"{path.relative_to(csrc)} ({own}) includes {header} ({target})")
    return problems


def test_each_layer_includes_only_layers_below_it():
    files = sources()
    assert len(files) > 100, "the scan found too few sources"
    problems = layering_violations(files, CSRC)
    assert not problems, "\n".join(problems)


def test_the_gpu_collectives_sit_above_the_communicator():
    assert not (CSRC / "core" / "transport" / "cuda_ipc").exists()
    assert not (CSRC / "core" / "transport" / "nccl").exists()
    for path in (CSRC / "core" / "transport").rglob("*"):
        if path.is_file():
            assert '"core/comm.h"' not in path.read_text(), path


def test_a_layer_that_includes_upward_is_reported(tmp_path):
    for name, text in {
        "core/transport/shm/x.cc": '#include "core/comm.h"\n#include "core/common/error.h"\n',
        "core/algo/y.h": '#include "core/tune/cost_model.h"\n#include <torch/torch.h>\n',
        "core/comm.cc": '#include "core/device/nccl/nccl.h"\n#include "core/exec/executor.h"\n',
        "core/device/z.cc": '#include "core/comm.h"\n',
        "gpu/w.cc": "",
    }.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    problems = layering_violations(sorted(tmp_path.rglob("*.*")), tmp_path)
    assert problems == [
        "core/algo/y.h (core/algo) includes core/tune/cost_model.h (core/tune)",
        "core/algo/y.h includes torch/torch.h: core is torch-free",
        "core/comm.cc (core/comm) includes core/device/nccl/nccl.h (core/device)",
        "core/transport/shm/x.cc (core/transport) includes core/comm.h (core/comm)",
        "gpu/w.cc: in no layer; add its folder to LAYERS",
    ], problems
