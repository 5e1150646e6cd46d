// Element-wise reduction of GPU buffers: the CUDA counterpart of
// cpu_reduce.h, for device memory (this process's, or a peer's mapped into
// it). Built only when nvcc was found (WEFT_HAVE_CUDA). No CUDA type crosses
// this header: a stream is a cudaStream_t passed as void*.
//
// Semantics are those of reduce::reduce() in cpu_reduce.h, extended from two
// inputs to n, with these differences:
// - The inputs are folded left: acc = srcs[0], then acc = acc (op) srcs[k]
//   for k = 1..n-1, each step with cpu_reduce's rules (a = acc, b = srcs[k];
//   Min/Max give NaN if any input is NaN). For n = 2 this is reduce().
// - float16/bfloat16 are widened once and the whole fold (and the division)
//   runs in float32, rounded once at the end. For n > 2 that is more exact
//   than chaining reduce() calls, which round after every pair.
// - A NaN result is NaN, but its payload may differ from the CPU's (GPU
//   arithmetic returns the canonical NaN).
// - n = 1 is allowed: a copy (or, for Avg with a divisor, a division).
// - No streaming (non-temporal) option: the stores are ordinary.
#pragma once

#include <cstddef>

#include "core/common/types.h"

namespace weft::reduce::cuda {

// The most inputs one reduce() takes.
constexpr int kMaxInputs = 16;

// dst[i] (and dst2[i] when not null) = srcs[0][i] (op) ... (op) srcs[n-1][i]
// for i < count, divided by `divisor` for ReduceOp::Avg when divisor > 0.
// - Every buffer is memory of `device` (or mapped into it), with any
//   alignment: 16-byte vector loads where all buffers share their offset
//   from a 16-byte boundary, element (or, misaligned, byte) loads otherwise.
// - dst may be one of the srcs (the same address); no other overlap.
// - Asynchronous: enqueued on `stream` (a cudaStream_t of `device`; null is
//   the legacy default stream) with no host synchronization. The calling
//   thread's current device is left as it was.
// Throws InvalidArgument for n outside 1..kMaxInputs, an unknown dtype or op,
// a null buffer when count > 0, or a device out of range; Error when CUDA
// fails (see device_count() for no device at all).
void reduce(void* dst, void* dst2, const void* const* srcs, int n, size_t count, DataType dtype,
            ReduceOp op, int divisor, int device, void* stream);

// The number of CUDA devices (at least 1). Throws Error "no CUDA device ..."
// with CUDA's reason when there is none, or no usable driver.
int device_count();

}  // namespace weft::reduce::cuda
