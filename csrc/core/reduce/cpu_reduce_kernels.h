// Internal to csrc/core/reduce: the kernel tables behind cpu_reduce.h. One
// table per instruction set; cpu_reduce.cc picks one once, at first use.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>

#include "core/common/types.h"

namespace weft::reduce::detail {

// Storage tags for the two 16-bit float formats.
struct Half {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};

// What a kernel computes per element, once reduce()/divide() have resolved
// the ReduceOp and the divisor.
enum class Kind : int {
  Sum,     // a + b (also Avg without a divisor)
  Prod,    // a * b
  Min,     // the smaller; NaN if either is (cpu_reduce.h)
  Max,     // the larger; NaN if either is
  SumDiv,  // (a + b) / divisor (Avg with a divisor)
  Div,     // a / divisor (b is ignored; callers pass b = a)
};
constexpr int kNumKinds = 6;

// The Kind that computes `op` (Avg is SumDiv where divisor > 0, else Sum).
// Throws InvalidArgument for an unknown op. Shared with the CUDA kernels.
Kind kind_of(ReduceOp op, int divisor);

// dst (and dst2 when not null) = kind(a, b) over `count` elements.
using KernelFn = void (*)(void* dst, void* dst2, const void* a, const void* b, size_t count,
                          int divisor, bool streaming);
using CopyFn = void (*)(void* dst, void* dst2, const void* src, size_t bytes, bool streaming);

struct KernelTable {
  KernelFn kernels[kNumDataTypes][kNumKinds];
  CopyFn copy;
  const char* name;
};

// Fills one row of a table with Kernel<T, K>::fn for every Kind.
template <template <class, Kind> class Kernel, class T, int... K>
void fill_row(KernelFn* row, std::integer_sequence<int, K...>) {
  ((row[K] = Kernel<T, static_cast<Kind>(K)>::fn), ...);
}

// A table of Kernel<T, K>::fn for every element type and Kind. HalfT and
// BFloat16T are the 16-bit float tags of the file that builds it.
template <template <class, Kind> class Kernel, class HalfT, class BFloat16T>
KernelTable make_table(CopyFn copy, const char* name) {
  KernelTable t{};
  auto kinds = std::make_integer_sequence<int, kNumKinds>();
  auto row = [&t](DataType dtype) { return t.kernels[static_cast<int>(dtype)]; };
  fill_row<Kernel, float>(row(DataType::Float32), kinds);
  fill_row<Kernel, double>(row(DataType::Float64), kinds);
  fill_row<Kernel, HalfT>(row(DataType::Float16), kinds);
  fill_row<Kernel, BFloat16T>(row(DataType::BFloat16), kinds);
  fill_row<Kernel, int8_t>(row(DataType::Int8), kinds);
  fill_row<Kernel, uint8_t>(row(DataType::UInt8), kinds);
  fill_row<Kernel, int32_t>(row(DataType::Int32), kinds);
  fill_row<Kernel, int64_t>(row(DataType::Int64), kinds);
  t.copy = copy;
  t.name = name;
  return t;
}

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
