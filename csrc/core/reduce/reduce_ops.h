// Internal to csrc/core/reduce: the per-element arithmetic of every Kind, as
// the portable CPU kernels (cpu_reduce.cc) and the CUDA kernels
// (cuda_reduce.cu) both use it, so that they agree on wrap-around, rounding
// and NaN rules. Compute types only: the 16-bit floats arrive widened to
// float.
#pragma once

#include <type_traits>

#include "core/reduce/cpu_reduce_kernels.h"

#ifdef __CUDACC__
#define WEFT_HOST_DEVICE __host__ __device__
#else
#define WEFT_HOST_DEVICE
#endif

namespace weft::reduce::detail {

// Integer Sum/Prod go through the unsigned type: they wrap, with no UB.
template <class C>
WEFT_HOST_DEVICE C add(C a, C b) {
  if constexpr (std::is_integral_v<C>) {
    using U = std::make_unsigned_t<C>;
    return static_cast<C>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  } else {
    return a + b;
  }
}

template <class C>
WEFT_HOST_DEVICE C mul(C a, C b) {
  if constexpr (std::is_integral_v<C>) {
    using U = std::make_unsigned_t<C>;
    return static_cast<C>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
  } else {
    return a * b;
  }
}

// Integers: truncation toward zero, as C++ `/`.
template <class C>
WEFT_HOST_DEVICE C divide_by(C a, int divisor) {
  if constexpr (std::is_integral_v<C>) {
    return static_cast<C>(a / divisor);
  } else {
    return a / static_cast<C>(divisor);
  }
}

// Min or Max, giving the same result in either operand order (ranks that
// combine theirs with mine and mine with theirs must agree): a NaN operand
// gives NaN, and of -0 and +0 Min gives -0 and Max +0.
template <Kind K, class C>
WEFT_HOST_DEVICE C min_or_max(C a, C b) {
  if (K == Kind::Min ? a < b : a > b) return a;
  if (K == Kind::Min ? b < a : b > a) return b;
  if constexpr (std::is_floating_point_v<C>) {
    if (a != a || b != b) return a + b;  // NaN
    const bool a_is_negative_zero = a == 0 && 1 / a < 0;
    return (K == Kind::Min) == a_is_negative_zero ? a : b;
  }
  return a;
}

template <Kind K, class C>
WEFT_HOST_DEVICE C combine(C a, C b, int divisor) {
  if constexpr (K == Kind::Sum) {
    return add(a, b);
  } else if constexpr (K == Kind::Prod) {
    return mul(a, b);
  } else if constexpr (K == Kind::Min || K == Kind::Max) {
    return min_or_max<K>(a, b);
  } else if constexpr (K == Kind::SumDiv) {
    return divide_by(add(a, b), divisor);
  } else {
    return divide_by(a, divisor);
  }
}

}  // namespace weft::reduce::detail
