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

// Storage tags for the two 16-bit float formats.
struct Half {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};

// Lanes<T>: one 32-byte block of T in compute form V, and the operations on
// it. Float Min/Max are vminps/vmaxps: a < b ? a : b (a > b ? a : b), so a
// NaN in either operand yields b.
template <class T>
struct Lanes;

template <>
struct Lanes<float> {
  using V = __m256;
  using Divisor = __m256;
  static V load(const unsigned char* p) { return _mm256_loadu_ps(reinterpret_cast<const float*>(p)); }
  static __m256i bits(V v) { return _mm256_castps_si256(v); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V min(V a, V b) { return _mm256_min_ps(a, b); }
  static V max(V a, V b) { return _mm256_max_ps(a, b); }
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
  static V min(V a, V b) { return _mm256_min_pd(a, b); }
  static V max(V a, V b) { return _mm256_max_pd(a, b); }
  static Divisor divisor(int d) { return _mm256_set1_pd(static_cast<double>(d)); }
  static V div(V a, Divisor d) { return _mm256_div_pd(a, d); }
};

// float16 <-> float32 with F16C; vcvtps2ph rounds to nearest even, quiets NaN.
struct HalfConvert {
  static __m256 widen(__m128i h) { return _mm256_cvtph_ps(h); }
  static __m256i narrow(__m256 lo, __m256 hi) {
    return _mm256_set_m128i(_mm256_cvtps_ph(hi, _MM_FROUND_TO_NEAREST_INT),
                            _mm256_cvtps_ph(lo, _MM_FROUND_TO_NEAREST_INT));
  }
};

// bfloat16 <-> float32 with integer shifts. Narrowing adds 0x7fff plus the
// lowest kept bit (round to nearest even; a carry into the exponent gives
// Inf); a NaN keeps its top bits and gets the quiet bit.
struct BFloat16Convert {
  static __m256 widen(__m128i h) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  static __m256i round(__m256 f) {  // 8 x u32, each holding 16 bits
    const __m256i u = _mm256_castps_si256(f);
    const __m256i high = _mm256_srli_epi32(u, 16);
    const __m256i bias = _mm256_add_epi32(_mm256_set1_epi32(0x7fff),
                                          _mm256_and_si256(high, _mm256_set1_epi32(1)));
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, bias), 16);
    const __m256i quiet = _mm256_or_si256(high, _mm256_set1_epi32(0x40));
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(f, f, _CMP_UNORD_Q));
    return _mm256_blendv_epi8(rounded, quiet, nan);
  }
  static __m256i narrow(__m256 lo, __m256 hi) {
    // packus works within 128-bit halves; the permute restores element order.
    return _mm256_permute4x64_epi64(_mm256_packus_epi32(round(lo), round(hi)), 0xd8);
  }
};

// 16 x 16-bit floats, computed as two vectors of 8 floats.
struct Wide {
  __m256 lo, hi;
};

template <class Convert>
struct Lanes16 {
  using V = Wide;
  using F = Lanes<float>;
  using Divisor = F::Divisor;
  static V load(const unsigned char* p) {
    return {Convert::widen(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
            Convert::widen(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16)))};
  }
  static __m256i bits(V v) { return Convert::narrow(v.lo, v.hi); }
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

// Quotients of 8 bytes (the low half of v) as int32, through float: exact
// after truncation, as |x| < 2^24.
template <bool kSigned>
__m256i quotient8(__m128i v, __m256 d) {
  const __m256i x = kSigned ? _mm256_cvtepi8_epi32(v) : _mm256_cvtepu8_epi32(v);
  return _mm256_cvttps_epi32(_mm256_div_ps(_mm256_cvtepi32_ps(x), d));
}

template <bool kSigned>
__m256i div_epi8(__m256i x, __m256 d) {
  const __m128i lo = _mm256_castsi256_si128(x);
  const __m128i hi = _mm256_extracti128_si256(x, 1);
  // The packs work within 128-bit halves; each permute restores element order.
  const __m256i w0 = _mm256_permute4x64_epi64(
      _mm256_packs_epi32(quotient8<kSigned>(lo, d), quotient8<kSigned>(_mm_srli_si128(lo, 8), d)),
      0xd8);
  const __m256i w1 = _mm256_permute4x64_epi64(
      _mm256_packs_epi32(quotient8<kSigned>(hi, d), quotient8<kSigned>(_mm_srli_si128(hi, 8), d)),
      0xd8);
  const __m256i b = kSigned ? _mm256_packs_epi16(w0, w1) : _mm256_packus_epi16(w0, w1);
  return _mm256_permute4x64_epi64(b, 0xd8);
}

template <>
struct Lanes<int8_t> : IntLanes {
  using Divisor = __m256;
  static V add(V a, V b) { return _mm256_add_epi8(a, b); }
  static V mul(V a, V b) { return mul_epi8(a, b); }
  static V min(V a, V b) { return _mm256_min_epi8(a, b); }
  static V max(V a, V b) { return _mm256_max_epi8(a, b); }
  static Divisor divisor(int d) { return _mm256_set1_ps(static_cast<float>(d)); }
  static V div(V a, Divisor d) { return div_epi8<true>(a, d); }
};

template <>
struct Lanes<uint8_t> : IntLanes {
  using Divisor = __m256;
  static V add(V a, V b) { return _mm256_add_epi8(a, b); }
  static V mul(V a, V b) { return mul_epi8(a, b); }
  static V min(V a, V b) { return _mm256_min_epu8(a, b); }
  static V max(V a, V b) { return _mm256_max_epu8(a, b); }
  static Divisor divisor(int d) { return _mm256_set1_ps(static_cast<float>(d)); }
  static V div(V a, Divisor d) { return div_epi8<false>(a, d); }
};

// int32 quotients through double: exact after truncation, as |x| < 2^53.
template <>
struct Lanes<int32_t> : IntLanes {
  using Divisor = __m256d;
  static V add(V a, V b) { return _mm256_add_epi32(a, b); }
  static V mul(V a, V b) { return _mm256_mullo_epi32(a, b); }
  static V min(V a, V b) { return _mm256_min_epi32(a, b); }
  static V max(V a, V b) { return _mm256_max_epi32(a, b); }
  static Divisor divisor(int d) { return _mm256_set1_pd(static_cast<double>(d)); }
  static V div(V a, Divisor d) {
    const __m128i lo = _mm256_cvttpd_epi32(_mm256_div_pd(_mm256_cvtepi32_pd(_mm256_castsi256_si128(a)), d));
    const __m128i hi =
        _mm256_cvttpd_epi32(_mm256_div_pd(_mm256_cvtepi32_pd(_mm256_extracti128_si256(a, 1)), d));
    return _mm256_set_m128i(hi, lo);
  }
};

// AVX2 has no 64-bit multiply, min or max: build them from 32-bit products
// and compares. Division is per element (no SIMD integer divide).
template <>
struct Lanes<int64_t> : IntLanes {
  using Divisor = int64_t;
  static V add(V a, V b) { return _mm256_add_epi64(a, b); }
  static V mul(V a, V b) {
    const __m256i lo = _mm256_mul_epu32(a, b);
    const __m256i cross = _mm256_add_epi64(_mm256_mul_epu32(_mm256_srli_epi64(a, 32), b),
                                           _mm256_mul_epu32(a, _mm256_srli_epi64(b, 32)));
    return _mm256_add_epi64(lo, _mm256_slli_epi64(cross, 32));
  }
  static V min(V a, V b) { return _mm256_blendv_epi8(a, b, _mm256_cmpgt_epi64(a, b)); }
  static V max(V a, V b) { return _mm256_blendv_epi8(a, b, _mm256_cmpgt_epi64(b, a)); }
  static Divisor divisor(int d) { return d; }
  static V div(V a, Divisor d) {
    alignas(32) int64_t v[4];
    _mm256_store_si256(reinterpret_cast<__m256i*>(v), a);
    for (int64_t& x : v) x /= d;
    return _mm256_load_si256(reinterpret_cast<const __m256i*>(v));
  }
};

// One 32-byte block of the result, narrowed back to storage bits.
template <class T, Kind K>
__m256i block(const unsigned char* a, const unsigned char* b,
              const typename Lanes<T>::Divisor& d) {
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
  size_t o = 0;
  if (nt && (o = head_bytes(d, bytes)) != 0) {
    partial_block<T, K>(d, d2, pa, pb, o, div);
  }
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
  size_t o = 0;
  if (streaming && (o = head_bytes(d, bytes)) != 0) {
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

template <class T, int... K>
void fill_row(KernelFn* row, std::integer_sequence<int, K...>) {
  ((row[K] = &avx2_kernel<T, static_cast<Kind>(K)>), ...);
}

template <class T>
void fill(KernelTable& t, DataType dtype) {
  fill_row<T>(t.kernels[static_cast<int>(dtype)], std::make_integer_sequence<int, kNumKinds>());
}

KernelTable make_avx2_table() {
  KernelTable t{};
  fill<float>(t, DataType::Float32);
  fill<double>(t, DataType::Float64);
  fill<Half>(t, DataType::Float16);
  fill<BFloat16>(t, DataType::BFloat16);
  fill<int8_t>(t, DataType::Int8);
  fill<uint8_t>(t, DataType::UInt8);
  fill<int32_t>(t, DataType::Int32);
  fill<int64_t>(t, DataType::Int64);
  t.copy = &avx2_copy;
  t.name = "avx2";
  return t;
}

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
