// Internal to csrc/core/reduce: the kernel tables behind cpu_reduce.h. One
// table per instruction set; cpu_reduce.cc picks one once, at first use.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/common/types.h"

namespace weft::reduce::detail {

// What a kernel computes per element, once reduce()/divide() have resolved
// the ReduceOp and the divisor.
enum class Kind : int {
  Sum,     // a + b (also Avg without a divisor)
  Prod,    // a * b
  Min,     // a < b ? a : b
  Max,     // a > b ? a : b
  SumDiv,  // (a + b) / divisor (Avg with a divisor)
  Div,     // a / divisor (b is ignored; callers pass b = a)
};
constexpr int kNumKinds = 6;

// dst (and dst2 when not null) = kind(a, b) over `count` elements.
using KernelFn = void (*)(void* dst, void* dst2, const void* a, const void* b, size_t count,
                          int divisor, bool streaming);
using CopyFn = void (*)(void* dst, void* dst2, const void* src, size_t bytes, bool streaming);

struct KernelTable {
  KernelFn kernels[kNumDataTypes][kNumKinds];
  CopyFn copy;
  const char* name;
};

// Plain C++ kernels: any CPU, any compiler. They ignore `streaming` (ordinary
// stores only).
const KernelTable& portable_kernels();

// AVX2 + F16C kernels, or nullptr when the CPU (or the build target) lacks them.
const KernelTable* avx2_kernels();

// The table reduce(), divide() and copy() use: AVX2 where available, else
// portable. Chosen at the first call.
const KernelTable& active_kernels();

// Float <-> float16 / bfloat16 with round-to-nearest-even, matching the AVX2
// kernels bit for bit (NaN stays NaN, quieted, sign kept).
float half_to_float(uint16_t h);
uint16_t float_to_half(float f);
float bfloat16_to_float(uint16_t h);
uint16_t float_to_bfloat16(float f);

}  // namespace weft::reduce::detail
