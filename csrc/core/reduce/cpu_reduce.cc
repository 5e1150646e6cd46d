// Entry points of cpu_reduce.h, the portable kernels, and the choice between
// them and the AVX2 kernels (cpu_reduce_avx2.cc), made once per process.
#include "core/reduce/cpu_reduce.h"

#include <cstdint>
#include <cstring>
#include <utility>

#include "core/common/error.h"
#include "core/reduce/cpu_reduce_kernels.h"
#include "core/reduce/reduce_ops.h"

namespace weft::reduce {
namespace detail {
namespace {

uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

}  // namespace

float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) {  // Inf, or NaN (quieted)
    return bits_float(sign | 0x7f800000u | (mant << 13) | (mant ? 0x400000u : 0u));
  }
  if (exp == 0) {  // zero or subnormal: mant * 2^-24, exact
    const float f = static_cast<float>(mant) * 0x1p-24f;
    return sign ? -f : f;
  }
  return bits_float(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t float_to_half(float f) {
  uint32_t x = float_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  x &= 0x7fffffffu;
  uint32_t h;
  if (x > 0x7f800000u) {  // NaN: quiet it, keep the sign and the top payload bits
    h = 0x7e00u | ((x >> 13) & 0x3ffu);
  } else if (x >= 0x47800000u) {  // >= 65536 (or Inf): Inf
    h = 0x7c00u;
  } else if (x < 0x38800000u) {  // below 2^-14: subnormal or zero; the FPU rounds
    h = float_bits(bits_float(x) + 0.5f) - 0x3f000000u;
  } else {  // normal: rebias, round to nearest even (a carry may reach Inf)
    x += 0xc8000fffu + ((x >> 13) & 1u);
    h = x >> 13;
  }
  return static_cast<uint16_t>(sign | h);
}

float bfloat16_to_float(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

uint16_t float_to_bfloat16(float f) {
  const uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

namespace {

// Loads/stores one element of storage type T (at any address) as its compute
// type C: T itself, or float for the 16-bit floats.
template <class T>
struct Scalar {
  using C = T;
  static C load(const unsigned char* p) {
    T v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  static void store(unsigned char* p, C v) { std::memcpy(p, &v, sizeof v); }
};

template <float (*Widen)(uint16_t), uint16_t (*Narrow)(float)>
struct Scalar16 {
  using C = float;
  static C load(const unsigned char* p) {
    uint16_t v;
    std::memcpy(&v, p, sizeof v);
    return Widen(v);
  }
  static void store(unsigned char* p, C v) {
    const uint16_t h = Narrow(v);
    std::memcpy(p, &h, sizeof h);
  }
};
template <>
struct Scalar<Half> : Scalar16<half_to_float, float_to_half> {};
template <>
struct Scalar<BFloat16> : Scalar16<bfloat16_to_float, float_to_bfloat16> {};

template <class T, Kind K>
void portable_kernel(void* dst, void* dst2, const void* a, const void* b, size_t count, int divisor,
                     bool /*streaming*/) {
  using S = Scalar<T>;
  auto* d = static_cast<unsigned char*>(dst);
  auto* d2 = static_cast<unsigned char*>(dst2);
  const auto* pa = static_cast<const unsigned char*>(a);
  const auto* pb = static_cast<const unsigned char*>(b);
  for (size_t i = 0; i < count; ++i) {
    const size_t o = i * sizeof(T);
    const typename S::C r = combine<K>(S::load(pa + o), S::load(pb + o), divisor);
    S::store(d + o, r);
    if (d2) S::store(d2 + o, r);
  }
}

void portable_copy(void* dst, void* dst2, const void* src, size_t bytes, bool /*streaming*/) {
  if (!dst2) {
    std::memcpy(dst, src, bytes);
    return;
  }
  // Both copies slice by slice: the second reads what the first left in cache.
  constexpr size_t kSlice = 64 << 10;
  auto* d = static_cast<unsigned char*>(dst);
  auto* d2 = static_cast<unsigned char*>(dst2);
  for (size_t o = 0; o < bytes; o += kSlice) {
    const size_t n = bytes - o < kSlice ? bytes - o : kSlice;
    std::memcpy(d + o, static_cast<const unsigned char*>(src) + o, n);
    std::memcpy(d2 + o, d + o, n);
  }
}

// The kernel of one element type and Kind, as make_table() wants it.
template <class T, Kind K>
struct PortableKernel {
  static constexpr KernelFn fn = &portable_kernel<T, K>;
};

KernelTable make_portable_table() {
  return make_table<PortableKernel, Half, BFloat16>(&portable_copy, "portable");
}

}  // namespace

const KernelTable& portable_kernels() {
  static const KernelTable table = make_portable_table();
  return table;
}

Kind kind_of(ReduceOp op, int divisor) {
  switch (op) {
    case ReduceOp::Sum: return Kind::Sum;
    case ReduceOp::Prod: return Kind::Prod;
    case ReduceOp::Min: return Kind::Min;
    case ReduceOp::Max: return Kind::Max;
    case ReduceOp::Avg: return divisor > 0 ? Kind::SumDiv : Kind::Sum;
  }
  throw InvalidArgument("reduce: unknown ReduceOp");
}

const KernelTable& active_kernels() {
  static const KernelTable* const table = [] {
    const KernelTable* t = avx2_kernels();
    return t ? t : &portable_kernels();
  }();
  return *table;
}

}  // namespace detail

namespace {

const detail::KernelTable& kernels() { return detail::active_kernels(); }

int checked_dtype(DataType dtype) {
  const int i = static_cast<int>(dtype);
  if (i < 0 || i >= kNumDataTypes) throw InvalidArgument("reduce: unknown DataType");
  return i;
}

}  // namespace

void reduce(void* dst, void* dst2, const void* a, const void* b, size_t count, DataType dtype,
            ReduceOp op, int divisor, bool streaming) {
  const int t = checked_dtype(dtype);
  const detail::Kind kind = detail::kind_of(op, divisor);
  if (count == 0) return;
  if (!dst || !a || !b) throw InvalidArgument("reduce: null buffer");
  kernels().kernels[t][static_cast<int>(kind)](dst, dst2, a, b, count, divisor, streaming);
}

void divide(void* dst, const void* src, size_t count, DataType dtype, int divisor) {
  const int t = checked_dtype(dtype);
  if (divisor <= 0) throw InvalidArgument("divide: divisor must be positive");
  if (count == 0) return;
  if (!dst || !src) throw InvalidArgument("divide: null buffer");
  kernels().kernels[t][static_cast<int>(detail::Kind::Div)](dst, nullptr, src, src, count, divisor,
                                                            false);
}

void copy(void* dst, void* dst2, const void* src, size_t bytes, bool streaming) {
  if (bytes == 0) return;
  if (!dst || !src) throw InvalidArgument("copy: null buffer");
  kernels().copy(dst, dst2, src, bytes, streaming);
}

}  // namespace weft::reduce
