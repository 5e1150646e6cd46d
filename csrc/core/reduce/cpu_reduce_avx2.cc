// AVX2 + F16C kernels for cpu_reduce.h, chosen at run time (the rest of the
// build targets baseline x86-64). Every kernel walks its buffers in 32-byte
// blocks: load a block of a and b, widen it to a compute form (Lanes<T>),
// combine, narrow, store. Partial blocks (head and tail) go through a
// zero-padded buffer on the stack, so every element takes the same path and
// results do not depend on alignment or count.
//
// Only code in this file's target region is compiled for AVX2; the table
// builder and the CPU check below it run on any x86-64. Nothing from the
// standard library is instantiated inside the region, so no AVX2 copy of a
// shared inline function can leak into the rest of the binary.
#include <cstdint>
#include <cstring>
#include <utility>

#include "core/reduce/cpu_reduce_kernels.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define WEFT_AVX2_KERNELS 1
#include <immintrin.h>
#endif

namespace weft::reduce::detail {

#if WEFT_AVX2_KERNELS

#pragma GCC push_options
#pragma GCC target("avx2,f16c")

namespace {

// Lanes<T>: one 32-byte block of T in compute form V, and the operations on
// it. Float Min/Max follow cpu_reduce.h (NaN if either operand is, -0 below
// +0) where vminps/vmaxps alone would return b for NaNs and for ties.
template <class T>
struct Lanes;

template <>
struct Lanes<float> {
  using V = __m256;
  using Divisor = __m256;
  static V load(const unsigned char* p) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
  }
  static __m256i bits(V v) { return _mm256_castps_si256(v); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V min(V a, V b) { return symmetric(_mm256_min_ps(a, b), _mm256_or_ps(a, b), a, b); }
  static V max(V a, V b) { return symmetric(_mm256_max_ps(a, b), _mm256_and_ps(a, b), a, b); }
  // `ordered` where a and b compare, `tie` (their bits or-ed for Min, and-ed
  // for Max: -0 wins Min, +0 Max) where equal, NaN where either is NaN.
  static V symmetric(V ordered, V tie, V a, V b) {
    const V r = _mm256_blendv_ps(ordered, tie, _mm256_cmp_ps(a, b, _CMP_EQ_OQ));
    return _mm256_blendv_ps(r, _mm256_add_ps(a, b), _mm256_cmp_ps(a, b, _CMP_UNORD_Q));
  }
  static Divisor divisor(int d) { return _mm256_set1_ps(static_cast<float>(d)); }
  static V div(V a, Divisor d) { return _mm256_div_ps(a, d); }
};

template <>
struct Lanes<double> {
  using V = __m256d;
  using Divisor = __m256d;
  static V load(const unsigned char* p) {
    return _mm256_loadu_pd(reinterpret_cast<const double*>(p));
  }
  static __m256i bits(V v) { return _mm256_castpd_si256(v); }
  static V add(V a, V b) { return _mm256_add_pd(a, b); }
  static V mul(V a, V b) { return _mm256_mul_pd(a, b); }
  static V min(V a, V b) { return symmetric(_mm256_min_pd(a, b), _mm256_or_pd(a, b), a, b); }
  static V max(V a, V b) { return symmetric(_mm256_max_pd(a, b), _mm256_and_pd(a, b), a, b); }
  // As Lanes<float>::symmetric.
  static V symmetric(V ordered, V tie, V a, V b) {
    const V r = _mm256_blendv_pd(ordered, tie, _mm256_cmp_pd(a, b, _CMP_EQ_OQ));
    return _mm256_blendv_pd(r, _mm256_add_pd(a, b), _mm256_cmp_pd(a, b, _CMP_UNORD_Q));
  }
  static Divisor divisor(int d) { return _mm256_set1_pd(static_cast<double>(d)); }
  static V div(V a, Divisor d) { return _mm256_div_pd(a, d); }
};

// 16 x 16-bit floats, computed as two vectors of 8 floats. Convert::load
// and Convert::narrow may order the elements within the pair as they like,
// as long as narrow undoes load.
struct Wide {
  __m256 lo, hi;
};

// float16 <-> float32 with F16C; vcvtps2ph rounds to nearest even, quiets NaN.
struct HalfConvert {
  static Wide load(const unsigned char* p) {
    return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
            _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16)))};
  }
  static __m256i narrow(Wide v) {
    return _mm256_set_m128i(_mm256_cvtps_ph(v.hi, _MM_FROUND_TO_NEAREST_INT),
                            _mm256_cvtps_ph(v.lo, _MM_FROUND_TO_NEAREST_INT));
  }
};

// bfloat16 <-> float32 with integer operations. A bfloat16 is the high half
// of a float, so widening interleaves with zeros (vpunpck{l,h}wd, which work
// within 128-bit halves: lo gets elements 0-3 and 8-11, hi 4-7 and 12-15)
// and vpackusdw in narrow() restores the order. Narrowing adds 0x7fff plus
// the lowest kept bit (round to nearest even; a carry into the exponent gives
// Inf). A NaN, rare, takes a second pass that keeps its top bits and sets the
// quiet bit instead.
struct BFloat16Convert {
  static Wide load(const unsigned char* p) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m256i zero = _mm256_setzero_si256();
    return {_mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, x)),
            _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, x))};
  }
  static __m256i round(__m256 f) {  // 8 x u32, each holding 16 bits
    const __m256i u = _mm256_castps_si256(f);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    return _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb),
                             16);
  }
  static __m256i quiet_nans(__m256i rounded, __m256 f) {
    const __m256i quiet =
        _mm256_or_si256(_mm256_srli_epi32(_mm256_castps_si256(f), 16), _mm256_set1_epi32(0x40));
    return _mm256_blendv_epi8(rounded, quiet,
                              _mm256_castps_si256(_mm256_cmp_ps(f, f, _CMP_UNORD_Q)));
  }
  static __m256i narrow(Wide v) {
    __m256i lo = round(v.lo);
    __m256i hi = round(v.hi);
    if (__builtin_expect(_mm256_movemask_ps(_mm256_cmp_ps(v.lo, v.hi, _CMP_UNORD_Q)) != 0, 0)) {
      lo = quiet_nans(lo, v.lo);
      hi = quiet_nans(hi, v.hi);
    }
    return _mm256_packus_epi32(lo, hi);
  }
};

template <class Convert>
struct Lanes16 {
  using V = Wide;
  using F = Lanes<float>;
  using Divisor = F::Divisor;
  static V load(const unsigned char* p) { return Convert::load(p); }
  static __m256i bits(V v) { return Convert::narrow(v); }
  static V add(V a, V b) { return {F::add(a.lo, b.lo), F::add(a.hi, b.hi)}; }
  static V mul(V a, V b) { return {F::mul(a.lo, b.lo), F::mul(a.hi, b.hi)}; }
  static V min(V a, V b) { return {F::min(a.lo, b.lo), F::min(a.hi, b.hi)}; }
  static V max(V a, V b) { return {F::max(a.lo, b.lo), F::max(a.hi, b.hi)}; }
  static Divisor divisor(int d) { return F::divisor(d); }
  static V div(V a, Divisor d) { return {F::div(a.lo, d), F::div(a.hi, d)}; }
};

template <>
struct Lanes<Half> : Lanes16<HalfConvert> {};
template <>
struct Lanes<BFloat16> : Lanes16<BFloat16Convert> {};

// Integers: add/mul wrap in hardware, as in the unsigned type.
struct IntLanes {
  using V = __m256i;
  static V load(const unsigned char* p) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  }
  static __m256i bits(V v) { return v; }
};

// Low 8 bits of each byte product: multiply even and odd bytes as 16-bit lanes.
__m256i mul_epi8(__m256i a, __m256i b) {
  const __m256i even = _mm256_mullo_epi16(a, b);
  const __m256i odd = _mm256_mullo_epi16(_mm256_srli_epi16(a, 8), _mm256_srli_epi16(b, 8));
  return _mm256_or_si256(_mm256_and_si256(even, _mm256_set1_epi16(0xff)),
                         _mm256_slli_epi16(odd, 8));
}

// Byte division (truncating, as C++ `/`) in 16-bit lanes: for 0 <= x < 2^8,
// x / d = (x * m) >> 16 with m = ceil(2^16 / d): writing m * d = 2^16 + e
// (e < d), the excess x * e / 2^16 stays below 1 for d <= 2^8, and for
// larger d both sides are 0. For d = 1 (m = 2^16) m is 0 and a mask adds x
// back. Signed bytes divide their magnitude.
struct ByteDivisor {
  __m256i m;     // low 16 bits of m
  __m256i self;  // all ones when d = 1
};

ByteDivisor byte_divisor(int d) {
  unsigned m = 0;  // d = 1: see `self`; d < 1 comes only with kernels that do not divide
  if (d > (1 << 16)) {
    m = 1;
  } else if (d >= 2) {
    m = ((1u << 16) + d - 1) / d;
  }
  return {_mm256_set1_epi16(static_cast<short>(m & 0xffff)),
          _mm256_set1_epi16(static_cast<short>(d == 1 ? -1 : 0))};
}

__m256i quotient16(__m256i x, const ByteDivisor& d) {
  return _mm256_add_epi16(_mm256_mulhi_epu16(x, d.m), _mm256_and_si256(x, d.self));
}

template <bool kSigned>
__m256i div_epi8(__m256i x, const ByteDivisor& d) {
  const __m256i u = kSigned ? _mm256_abs_epi8(x) : x;
  const __m256i zero = _mm256_setzero_si256();
  // unpack and packus both work within 128-bit halves, so the order holds.
  const __m256i q = _mm256_packus_epi16(quotient16(_mm256_unpacklo_epi8(u, zero), d),
                                        quotient16(_mm256_unpackhi_epi8(u, zero), d));
  return kSigned ? _mm256_sign_epi8(q, x) : q;
}

template <>
struct Lanes<int8_t> : IntLanes {
  using Divisor = ByteDivisor;
  static V add(V a, V b) { return _mm256_add_epi8(a, b); }
  static V mul(V a, V b) { return mul_epi8(a, b); }
  static V min(V a, V b) { return _mm256_min_epi8(a, b); }
  static V max(V a, V b) { return _mm256_max_epi8(a, b); }
  static Divisor divisor(int d) { return byte_divisor(d); }
  static V div(V a, const Divisor& d) { return div_epi8<true>(a, d); }
};

template <>
struct Lanes<uint8_t> : IntLanes {
  using Divisor = ByteDivisor;
  static V add(V a, V b) { return _mm256_add_epi8(a, b); }
  static V mul(V a, V b) { return mul_epi8(a, b); }
  static V min(V a, V b) { return _mm256_min_epu8(a, b); }
  static V max(V a, V b) { return _mm256_max_epu8(a, b); }
  static Divisor divisor(int d) { return byte_divisor(d); }
  static V div(V a, const Divisor& d) { return div_epi8<false>(a, d); }
};

// int32 division multiplies by 1/d enlarged by 2^-40, in double. With the
// rounding errors the product is x/d * (1 + e), 0 < e < 2^-39: never below
// an exact integer quotient, and never up to the next integer above an
// inexact one, which lies at least 1/d away, more than |x/d| * e as
// |x| <= 2^31.
template <>
struct Lanes<int32_t> : IntLanes {
  using Divisor = __m256d;
  static V add(V a, V b) { return _mm256_add_epi32(a, b); }
  static V mul(V a, V b) { return _mm256_mullo_epi32(a, b); }
  static V min(V a, V b) { return _mm256_min_epi32(a, b); }
  static V max(V a, V b) { return _mm256_max_epi32(a, b); }
  static Divisor divisor(int d) { return _mm256_set1_pd(1.0 / d * (1 + 0x1p-40)); }
  static V div(V a, Divisor d) {
    const __m256d lo = _mm256_cvtepi32_pd(_mm256_castsi256_si128(a));
    const __m256d hi = _mm256_cvtepi32_pd(_mm256_extracti128_si256(a, 1));
    return _mm256_set_m128i(_mm256_cvttpd_epi32(_mm256_mul_pd(hi, d)),
                            _mm256_cvttpd_epi32(_mm256_mul_pd(lo, d)));
  }
};

// AVX2 has no 64-bit multiply, min, max or conversion to double: build them
// from 32-bit products, compares and the 1.5 * 2^52 trick (exact for
// |x| < 2^51). Division goes through double when every element is that
// small (a correctly rounded quotient truncates right for |x| < 2^53), else
// element by element.
template <>
struct Lanes<int64_t> : IntLanes {
  struct Divisor {
    __m256d d;
    int64_t i;
  };
  static V add(V a, V b) { return _mm256_add_epi64(a, b); }
  static V mul(V a, V b) {
    const __m256i lo = _mm256_mul_epu32(a, b);
    const __m256i cross = _mm256_add_epi64(_mm256_mul_epu32(_mm256_srli_epi64(a, 32), b),
                                           _mm256_mul_epu32(a, _mm256_srli_epi64(b, 32)));
    return _mm256_add_epi64(lo, _mm256_slli_epi64(cross, 32));
  }
  static V min(V a, V b) { return _mm256_blendv_epi8(a, b, _mm256_cmpgt_epi64(a, b)); }
  static V max(V a, V b) { return _mm256_blendv_epi8(a, b, _mm256_cmpgt_epi64(b, a)); }
  static Divisor divisor(int d) { return {_mm256_set1_pd(static_cast<double>(d)), d}; }
  static V div(V a, const Divisor& d) {
    const __m256i offset = _mm256_add_epi64(a, _mm256_set1_epi64x(int64_t{1} << 51));
    if (_mm256_testz_si256(offset, _mm256_set1_epi64x(-(int64_t{1} << 52)))) {
      const __m256d magic = _mm256_set1_pd(0x1.8p52);
      const __m256d x = _mm256_sub_pd(
          _mm256_castsi256_pd(_mm256_add_epi64(a, _mm256_castpd_si256(magic))), magic);
      const __m256d q =
          _mm256_round_pd(_mm256_div_pd(x, d.d), _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
      return _mm256_sub_epi64(_mm256_castpd_si256(_mm256_add_pd(q, magic)),
                              _mm256_castpd_si256(magic));
    }
    alignas(32) int64_t v[4];
    _mm256_store_si256(reinterpret_cast<__m256i*>(v), a);
    for (int64_t& x : v) x /= d.i;
    return _mm256_load_si256(reinterpret_cast<const __m256i*>(v));
  }
};

// One 32-byte block of the result, narrowed back to storage bits.
template <class T, Kind K>
__m256i block(const unsigned char* a, const unsigned char* b, const typename Lanes<T>::Divisor& d) {
  using L = Lanes<T>;
  const typename L::V x = L::load(a);
  if constexpr (K == Kind::Div) {
    return L::bits(L::div(x, d));
  } else {
    const typename L::V y = L::load(b);
    if constexpr (K == Kind::Sum) {
      return L::bits(L::add(x, y));
    } else if constexpr (K == Kind::Prod) {
      return L::bits(L::mul(x, y));
    } else if constexpr (K == Kind::Min) {
      return L::bits(L::min(x, y));
    } else if constexpr (K == Kind::Max) {
      return L::bits(L::max(x, y));
    } else {
      return L::bits(L::div(L::add(x, y), d));
    }
  }
}

void store(unsigned char* p, __m256i v, bool nt) {
  if (nt) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(p), v);
  } else {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v);
  }
}

// `bytes` < 32 of a block, through zero-padded buffers; ordinary stores.
template <class T, Kind K>
void partial_block(unsigned char* d, unsigned char* d2, const unsigned char* a,
                   const unsigned char* b, size_t bytes, const typename Lanes<T>::Divisor& div) {
  alignas(32) unsigned char ta[32] = {};
  alignas(32) unsigned char tb[32] = {};
  alignas(32) unsigned char tr[32];
  std::memcpy(ta, a, bytes);
  std::memcpy(tb, b, bytes);
  _mm256_store_si256(reinterpret_cast<__m256i*>(tr), block<T, K>(ta, tb, div));
  std::memcpy(d, tr, bytes);
  if (d2) std::memcpy(d2, tr, bytes);
}

// Bytes before the first 32-byte boundary of p, at most n.
size_t head_bytes(const void* p, size_t n) {
  const size_t head = (0 - reinterpret_cast<uintptr_t>(p)) & 31;
  return head < n ? head : n;
}

template <class T, Kind K>
void avx2_kernel(void* dst, void* dst2, const void* a, const void* b, size_t count, int divisor,
                 bool streaming) {
  const typename Lanes<T>::Divisor div = Lanes<T>::divisor(divisor);
  auto* d = static_cast<unsigned char*>(dst);
  auto* d2 = static_cast<unsigned char*>(dst2);
  const auto* pa = static_cast<const unsigned char*>(a);
  const auto* pb = static_cast<const unsigned char*>(b);
  const size_t bytes = count * sizeof(T);
  // Non-temporal stores need a 32-byte aligned dst: get there with a partial
  // block, which is possible when dst is aligned to its element size.
  const bool nt = streaming && reinterpret_cast<uintptr_t>(d) % sizeof(T) == 0;
  size_t o = nt ? head_bytes(d, bytes) : 0;
  if (o != 0) partial_block<T, K>(d, d2, pa, pb, o, div);
  for (; o + 32 <= bytes; o += 32) {
    const __m256i r = block<T, K>(pa + o, pb + o, div);
    store(d + o, r, nt);
    if (d2) _mm256_storeu_si256(reinterpret_cast<__m256i*>(d2 + o), r);
  }
  if (o < bytes) partial_block<T, K>(d + o, d2 ? d2 + o : d2, pa + o, pb + o, bytes - o, div);
  if (nt) _mm_sfence();
}

void avx2_copy(void* dst, void* dst2, const void* src, size_t bytes, bool streaming) {
  auto* d = static_cast<unsigned char*>(dst);
  auto* d2 = static_cast<unsigned char*>(dst2);
  const auto* s = static_cast<const unsigned char*>(src);
  if (!streaming && !d2) {
    std::memcpy(d, s, bytes);
    return;
  }
  size_t o = streaming ? head_bytes(d, bytes) : 0;
  if (o != 0) {
    std::memcpy(d, s, o);
    if (d2) std::memcpy(d2, s, o);
  }
  for (; o + 128 <= bytes; o += 128) {
    __m256i v[4];
    for (int k = 0; k < 4; ++k) {
      v[k] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + o + 32 * k));
    }
    for (int k = 0; k < 4; ++k) store(d + o + 32 * k, v[k], streaming);
    if (d2) {
      for (int k = 0; k < 4; ++k) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(d2 + o + 32 * k), v[k]);
      }
    }
  }
  if (o < bytes) {
    std::memcpy(d + o, s + o, bytes - o);
    if (d2) std::memcpy(d2 + o, s + o, bytes - o);
  }
  if (streaming) _mm_sfence();
}

}  // namespace

#pragma GCC pop_options

namespace {

// The kernel of one element type and Kind, as make_table() wants it.
template <class T, Kind K>
struct Avx2Kernel {
  static constexpr KernelFn fn = &avx2_kernel<T, K>;
};

KernelTable make_avx2_table() { return make_table<Avx2Kernel, Half, BFloat16>(&avx2_copy, "avx2"); }

}  // namespace

const KernelTable* avx2_kernels() {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("f16c")) return nullptr;
  static const KernelTable table = make_avx2_table();
  return &table;
}

#else  // !WEFT_AVX2_KERNELS

const KernelTable* avx2_kernels() { return nullptr; }

#endif

}  // namespace weft::reduce::detail
