"""The CUDA kernels are compiled into weft._C for sm_80 and sm_90, with PTX for later GPUs
(the default CMAKE_CUDA_ARCHITECTURES): checked in the built extension with cuobjdump, no GPU
needed. Skipped when weft was built without CUDA or no cuobjdump is found (the CUDA toolkit's,
or the nvidia-cuda-cuobjdump wheel's)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import weft._C
import weft.cuda


def find_cuobjdump() -> str | None:
    candidates = [shutil.which("cuobjdump")]
    for home in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if home:
            candidates.append(str(Path(home, "bin", "cuobjdump")))
    spec = importlib.util.find_spec("nvidia")
    for root in spec.submodule_search_locations if spec else []:
        candidates += [str(p) for p in Path(root).glob("cu*/bin/cuobjdump")]
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


CUOBJDUMP = find_cuobjdump()
pytestmark = [
    pytest.mark.skipif(not weft.cuda.is_built(), reason="weft was built without CUDA"),
    pytest.mark.skipif(CUOBJDUMP is None, reason="no cuobjdump"),
]


def listing(flag: str) -> str:
    return subprocess.run(
        [CUOBJDUMP, flag, weft._C.__file__], check=True, capture_output=True, text=True
    ).stdout


def test_kernels_are_built_for_sm80_and_sm90_with_ptx():
    elf = listing("--list-elf")
    assert ".sm_80.cubin" in elf and ".sm_90.cubin" in elf, elf
    assert ".sm_90.ptx" in listing("--list-ptx")
