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

template <Kind K, class C>
WEFT_HOST_DEVICE C combine(C a, C b, int divisor) {
  if constexpr (K == Kind::Sum) {
    return add(a, b);
  } else if constexpr (K == Kind::Prod) {
    return mul(a, b);
  } else if constexpr (K == Kind::Min) {
    return a < b ? a : b;
  } else if constexpr (K == Kind::Max) {
    return a > b ? a : b;
  } else if constexpr (K == Kind::SumDiv) {
    return divide_by(add(a, b), divisor);
  } else {
    return divide_by(a, divisor);
  }
}

}  // namespace weft::reduce::detail
