"""The reduction loops must compile to vector code: checked in the built extension itself."""

import platform
import shutil
import subprocess

import pytest
import weft._C

pytestmark = pytest.mark.skipif(
    platform.machine() != "x86_64" or shutil.which("objdump") is None,
    reason="needs x86-64 and objdump",
)

# One packed instruction per kind of loop: fp32 add, fp16 widening and narrowing, bf16 packing,
# integer adds, and the non-temporal stores of the streaming path.
EXPECTED = {
    "float32 add": "vaddps",
    "float64 add": "vaddpd",
    "fp16 to fp32": "vcvtph2ps",
    "fp32 to fp16": "vcvtps2ph",
    "int32 add": "vpaddd",
    "int8 add": "vpaddb",
    "streaming store": "vmovnt",
}


def test_reduction_kernels_use_256_bit_vectors():
    disassembly = subprocess.run(
        ["objdump", "-d", "--no-show-raw-insn", weft._C.__file__],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    ymm_lines = [line for line in disassembly.splitlines() if "%ymm" in line]
    missing = [
        name
        for name, mnemonic in EXPECTED.items()
        if not any(mnemonic in line for line in ymm_lines)
    ]
    assert not missing, f"no 256-bit instructions found for: {missing}"
