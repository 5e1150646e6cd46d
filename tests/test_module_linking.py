"""weft's modules share torch's libstdc++ instead of carrying their own copy.

Some GCC builds link libstdc++ statically into every shared object. A module built that way
holds a second libstdc++ inside torch's process, and the two mix: numbers vanish from error
messages (seen here: "invalid tensor size at index " and nothing after), or formatting them
crashes (seen on a GPU machine's toolchain). CMakeLists.txt links the shared libstdc++ first;
these tests check the result and its symptom."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import weft
from weft_proc import Ranks

MODULES = sorted(Path(weft.__file__).parent.glob("_C*.so"))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="checks ELF shared objects")
@pytest.mark.skipif(shutil.which("readelf") is None, reason="no readelf (binutils)")
@pytest.mark.parametrize("module", MODULES, ids=lambda p: p.name.split(".")[0])
def test_modules_load_the_shared_libstdcxx(module):
    dynamic = subprocess.run(
        ["readelf", "-d", str(module)], check=True, capture_output=True, text=True
    ).stdout
    assert "[libstdc++.so.6]" in dynamic, f"{module.name} does not load libstdc++.so.6:\n{dynamic}"


def scenario_size_mismatch(rank, size, store):
    import torch
    import torch.distributed as dist

    dist.init_process_group("weft", store=store, rank=rank, world_size=size)
    try:
        dist.all_gather([torch.zeros(3, 4)], torch.zeros(4, 3))
    except RuntimeError as exc:
        return str(exc)
    finally:
        dist.destroy_process_group()
    return "no error"


def test_error_messages_keep_their_numbers():
    with Ranks(scenario_size_mismatch, 1) as ranks:
        (message,) = ranks.results(timeout=120)
    assert "invalid tensor size at index 0 (expected [4, 3], got [3, 4])" in message, message
