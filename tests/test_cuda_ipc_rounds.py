"""cuda_ipc's round and slice arithmetic (csrc/core/device/cuda_ipc/chunks.h), on the CPU.

chunks.h is plain C++: a small program includes it, checks every property the collectives rely
on over a grid of counts, ranks and sizes, and prints what fails. Needs a C++17 compiler
(skipped without one); no GPU.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

PROGRAM = r"""
#include <cstdio>
#include "core/device/cuda_ipc/chunks.h"
using namespace weft::cuda_ipc;
int main() {
  int bad = 0;
  auto fail = [&](const char* what, size_t a, size_t b, size_t c) {
    if (++bad <= 20) std::printf("%s: %zu %zu %zu\n", what, a, b, c);
  };
  for (size_t count = 0; count <= 300; ++count) {
    for (int parts = 1; parts <= 16; ++parts) {
      size_t next = 0, smallest = count, largest = 0;
      for (int i = 0; i < parts; ++i) {
        const Span s = part(count, parts, i);
        if (s.begin != next) fail("part not contiguous", count, parts, i);
        next = s.begin + s.count;
        smallest = s.count < smallest ? s.count : smallest;
        largest = s.count > largest ? s.count : largest;
      }
      if (next != count) fail("parts do not cover the count", count, parts, next);
      if (largest - smallest > 1) fail("parts uneven", count, parts, largest - smallest);
    }
  }
  for (size_t staging : {size_t(1), size_t(100), size_t(4096), size_t(64) << 20}) {
    for (size_t elem : {1, 2, 4, 8}) {
      for (size_t blocks = 1; blocks <= 16; ++blocks) {
        const size_t step = round_elements(staging, elem, blocks);
        if (step < 1) fail("empty round", staging, elem, blocks);
        const size_t bytes = step * elem * blocks;
        if (step > 1 && bytes > staging) fail("round overflows", staging, elem, blocks);
        if (bytes + elem * blocks <= staging) fail("round too small", staging, elem, blocks);
      }
    }
  }
  for (size_t count = 0; count <= 1000; ++count) {
    for (size_t step = 1; step <= 40; ++step) {
      const size_t n = rounds(count, step);
      if (n * step < count || (n > 0 && (n - 1) * step >= count)) fail("rounds", count, step, n);
    }
  }
  std::printf(bad ? "%d failures\n" : "ok\n", bad);
  return bad != 0;
}
"""


@pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler (c++) on the PATH")
def test_round_and_slice_arithmetic(tmp_path):
    source = tmp_path / "rounds.cc"
    source.write_text(PROGRAM)
    binary = tmp_path / "rounds"
    subprocess.run(
        ["c++", "-std=c++17", "-Wall", "-Wextra", "-Werror", f"-I{ROOT / 'csrc'}", str(source)]
        + ["-o", str(binary)],
        check=True,
    )
    result = subprocess.run([str(binary)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout
