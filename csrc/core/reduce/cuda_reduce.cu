// The CUDA kernels of cuda_reduce.h. One kernel per element type and Kind;
// each thread walks the buffers grid-stride in 16-byte vectors (two vectors
// of two inputs loaded before any is combined, so that enough loads are in
// flight to saturate HBM), and the elements outside the aligned body (head,
// tail, or all of them when the buffers are not mutually aligned) element by
// element.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>

#include "core/common/cuda_check.h"
#include "core/common/error.h"
#include "core/reduce/cpu_reduce_kernels.h"
#include "core/reduce/cuda_reduce.h"
#include "core/reduce/reduce_ops.h"

namespace weft::reduce::cuda {
namespace {

using detail::Kind;

constexpr int kThreads = 512;
constexpr size_t kVecBytes = 16;
// Inputs, and vectors of each, loaded together before they are combined.
constexpr int kGroup = 2;
constexpr int kUnroll = 2;

void check(cudaError_t err, const char* what) {
  check_cuda(err, std::string("CUDA reduce: ") + what);
}

// Storage tags of the 16-bit floats.
struct Half {};
struct BFloat16 {};

// Element type T as stored (S) and as computed (C), and the conversions.
template <class T>
struct Elem {
  using S = T;
  using C = T;
  __device__ static C widen(S v) { return v; }
  __device__ static S narrow(C v) { return v; }
};
template <>
struct Elem<Half> {
  using S = uint16_t;
  using C = float;
  __device__ static C widen(S v) { return __half2float(__ushort_as_half(v)); }
  __device__ static S narrow(C v) { return __half_as_ushort(__float2half_rn(v)); }
};
template <>
struct Elem<BFloat16> {
  using S = uint16_t;
  using C = float;
  __device__ static C widen(S v) { return __bfloat162float(__ushort_as_bfloat16(v)); }
  __device__ static S narrow(C v) { return __bfloat16_as_ushort(__float2bfloat16_rn(v)); }
};

// 16 bytes as a vector load sees them and as elements.
template <class S>
union Vec {
  uint4 raw;
  S e[kVecBytes / sizeof(S)];
};

struct Args {
  const void* srcs[kMaxInputs];
  void* dst;
  void* dst2;
  size_t count;
  size_t head;  // elements before the 16-byte aligned body
  size_t vecs;  // 16-byte vectors in the body
  int n;
  int divisor;
  bool bytewise;  // some buffer is not aligned to the element size
};

// One fold step: Avg (SumDiv) sums, and divides once at the end.
template <Kind K, class C>
__device__ C step(C acc, C x) {
  return detail::combine<K == Kind::SumDiv ? Kind::Sum : K>(acc, x, 0);
}

template <Kind K, class C>
__device__ C finish(C acc, int divisor) {
  if constexpr (K == Kind::SumDiv) return detail::divide_by(acc, divisor);
  return acc;
}

// The 16 bytes at byte offset `at` of p (p + at is 16-byte aligned).
__device__ const uint4& vec_at(const void* p, size_t at) {
  return *reinterpret_cast<const uint4*>(static_cast<const unsigned char*>(p) + at);
}
__device__ uint4& vec_at(void* p, size_t at) {
  return *reinterpret_cast<uint4*>(static_cast<unsigned char*>(p) + at);
}

template <class S>
__device__ S load(const void* p, size_t i, bool bytewise) {
  S v;
  if (bytewise) {
    memcpy(&v, static_cast<const unsigned char*>(p) + i * sizeof(S), sizeof(S));
  } else {
    v = static_cast<const S*>(p)[i];
  }
  return v;
}

template <class S>
__device__ void store(void* p, size_t i, S v, bool bytewise) {
  if (bytewise) {
    memcpy(static_cast<unsigned char*>(p) + i * sizeof(S), &v, sizeof(S));
  } else {
    static_cast<S*>(p)[i] = v;
  }
}

template <class T, Kind K>
__global__ void __launch_bounds__(kThreads) reduce_kernel(const Args a) {
  using E = Elem<T>;
  using S = typename E::S;
  using C = typename E::C;
  constexpr int V = kVecBytes / sizeof(S);
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;

  // The aligned body: vector v covers elements head + v*V ... + V-1. Each
  // pass takes kUnroll vectors, `stride` apart, for more loads in flight.
  for (size_t v0 = tid; v0 < a.vecs; v0 += stride * kUnroll) {
    size_t at[kUnroll];
    bool live[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      live[u] = v0 + u * stride < a.vecs;
      at[u] = a.head * sizeof(S) + (v0 + u * stride) * kVecBytes;
    }
    C acc[kUnroll][V] = {};
    for (int k0 = 0; k0 < a.n; k0 += kGroup) {
      Vec<S> in[kGroup][kUnroll];
#pragma unroll
      for (int j = 0; j < kGroup; ++j) {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          if (k0 + j < a.n && live[u]) in[j][u].raw = vec_at(a.srcs[k0 + j], at[u]);
        }
      }
#pragma unroll
      for (int j = 0; j < kGroup; ++j) {
        if (k0 + j >= a.n) break;
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
          for (int e = 0; e < V; ++e) {
            const C x = E::widen(in[j][u].e[e]);
            acc[u][e] = k0 + j == 0 ? x : step<K>(acc[u][e], x);
          }
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (!live[u]) continue;
      Vec<S> out;
#pragma unroll
      for (int e = 0; e < V; ++e) out.e[e] = E::narrow(finish<K>(acc[u][e], a.divisor));
      vec_at(a.dst, at[u]) = out.raw;
      if (a.dst2) vec_at(a.dst2, at[u]) = out.raw;
    }
  }

  // Head and tail, element by element: r < head is element r, the rest
  // follow the body.
  const size_t body_end = a.head + a.vecs * V;
  const size_t rest = a.head + (a.count - body_end);
  for (size_t r = tid; r < rest; r += stride) {
    const size_t i = r < a.head ? r : body_end + (r - a.head);
    C acc = E::widen(load<S>(a.srcs[0], i, a.bytewise));
    for (int k = 1; k < a.n; ++k) acc = step<K>(acc, E::widen(load<S>(a.srcs[k], i, a.bytewise)));
    const S out = E::narrow(finish<K>(acc, a.divisor));
    store<S>(a.dst, i, out, a.bytewise);
    if (a.dst2) store<S>(a.dst2, i, out, a.bytewise);
  }
}

// Blocks of kThreads that keep every SM of `device` busy with `kernel`.
int full_grid(const void* kernel, int device) {
  int sms = 0, per_sm = 0;
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
        "cudaDeviceGetAttribute");
  check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0),
        "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  return sms * per_sm;
}

// Launches the kernel on a grid that fills the device, or less when `work`
// (threads with something to do) is smaller.
template <class T, Kind K>
void launch(const Args& args, size_t work, int device, cudaStream_t stream) {
  constexpr int kCachedDevices = 64;
  static std::atomic<int> full[kCachedDevices];  // per device, 0 until the first launch
  const auto kernel = reduce_kernel<T, K>;
  int blocks = device < kCachedDevices ? full[device].load(std::memory_order_relaxed) : 0;
  if (blocks == 0) {
    blocks = full_grid(reinterpret_cast<const void*>(kernel), device);
    if (device < kCachedDevices) full[device].store(blocks, std::memory_order_relaxed);
  }
  const size_t needed = (work + kThreads - 1) / kThreads;
  if (needed < static_cast<size_t>(blocks)) blocks = static_cast<int>(needed);
  kernel<<<blocks, kThreads, 0, stream>>>(args);
  check(cudaGetLastError(), "kernel launch");
}

template <class T>
void launch(const Args& args, Kind kind, int device, cudaStream_t stream) {
  constexpr size_t kPerVec = kVecBytes / sizeof(typename Elem<T>::S);
  const size_t work = args.vecs + (args.count - args.vecs * kPerVec);
  switch (kind) {
    case Kind::Sum: launch<T, Kind::Sum>(args, work, device, stream); break;
    case Kind::Prod: launch<T, Kind::Prod>(args, work, device, stream); break;
    case Kind::Min: launch<T, Kind::Min>(args, work, device, stream); break;
    case Kind::Max: launch<T, Kind::Max>(args, work, device, stream); break;
    case Kind::SumDiv: launch<T, Kind::SumDiv>(args, work, device, stream); break;
    default: throw InvalidArgument("CUDA reduce: unknown ReduceOp");
  }
}

// Where the buffers allow, the 16-byte aligned body of the element range.
void split(Args& args, size_t elem) {
  uintptr_t any_bits = reinterpret_cast<uintptr_t>(args.dst);
  const uintptr_t offset = reinterpret_cast<uintptr_t>(args.srcs[0]) % kVecBytes;
  bool same_offset = reinterpret_cast<uintptr_t>(args.dst) % kVecBytes == offset;
  auto visit = [&](const void* p) {
    const uintptr_t u = reinterpret_cast<uintptr_t>(p);
    any_bits |= u;
    same_offset = same_offset && u % kVecBytes == offset;
  };
  for (int k = 0; k < args.n; ++k) visit(args.srcs[k]);
  if (args.dst2) visit(args.dst2);
  args.bytewise = any_bits % elem != 0;
  args.head = args.count;
  args.vecs = 0;
  if (args.bytewise || !same_offset) return;
  const size_t head = (kVecBytes - offset) % kVecBytes / elem;
  if (head >= args.count) return;
  args.head = head;
  args.vecs = (args.count - head) * elem / kVecBytes;
}

}  // namespace

int device_count() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    cudaGetLastError();  // not sticky: clear it
    std::string why = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(err);
    if (err == cudaErrorInsufficientDriver) {
      why = "no NVIDIA driver, or one older than the CUDA " +
            std::to_string(CUDART_VERSION / 1000) + "." +
            std::to_string(CUDART_VERSION % 1000 / 10) + " runtime weft was built with (" + why +
            ")";
    }
    throw Error("no CUDA device: " + why);
  }
  if (n == 0) throw Error("no CUDA device: the driver reports none");
  return n;
}

void reduce(void* dst, void* dst2, const void* const* srcs, int n, size_t count, DataType dtype,
            ReduceOp op, int divisor, int device, void* stream) {
  if (n < 1 || n > kMaxInputs) {
    throw InvalidArgument("CUDA reduce: " + std::to_string(n) + " inputs; it takes 1 to " +
                          std::to_string(kMaxInputs));
  }
  const Kind kind = detail::kind_of(op, divisor);
  const size_t elem = element_size(dtype);
  const int devices = device_count();
  if (device < 0 || device >= devices) {
    throw InvalidArgument("CUDA reduce: device " + std::to_string(device) + " out of range (" +
                          std::to_string(devices) + " devices)");
  }
  if (count == 0) return;
  Args args{};
  args.dst = dst;
  args.dst2 = dst2;
  args.count = count;
  args.n = n;
  args.divisor = divisor;
  bool null_buffer = dst == nullptr;
  for (int k = 0; k < n; ++k) {
    args.srcs[k] = srcs[k];
    null_buffer = null_buffer || srcs[k] == nullptr;
  }
  if (null_buffer) throw InvalidArgument("CUDA reduce: null buffer");
  split(args, elem);

  DeviceGuard guard(device);
  auto s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case DataType::Float32: launch<float>(args, kind, device, s); break;
    case DataType::Float64: launch<double>(args, kind, device, s); break;
    case DataType::Float16: launch<Half>(args, kind, device, s); break;
    case DataType::BFloat16: launch<BFloat16>(args, kind, device, s); break;
    case DataType::Int8: launch<int8_t>(args, kind, device, s); break;
    case DataType::UInt8: launch<uint8_t>(args, kind, device, s); break;
    case DataType::Int32: launch<int32_t>(args, kind, device, s); break;
    case DataType::Int64: launch<int64_t>(args, kind, device, s); break;
  }
}

}  // namespace weft::reduce::cuda
