// Element-wise reduction and copy loops for host memory. They are the only
// place that touches payload bytes on the CPU, so they are written to
// vectorize (AVX2 + F16C when the CPU has it, chosen once at run time, in
// cpu_reduce_avx2.cc; plain C++ otherwise, in cpu_reduce.cc) and can use
// non-temporal stores for destinations that will not be read again soon.
//
// Buffers may have any alignment. Both paths give the same results, bit for
// bit (NaN payloads aside).
#pragma once

#include <cstddef>

#include "core/common/types.h"

namespace weft::reduce {

// dst[i] = a[i] (op) b[i] for i < count.
// - ReduceOp::Avg reduces like Sum; the division happens where `divisor` > 0:
//   the result is then divided by `divisor` (integers truncate toward zero,
//   as C++ `/`). Other ops ignore `divisor`.
// - float16/bfloat16 are widened to float32, reduced (and divided), rounded
//   once to nearest-even. Overflow gives Inf; a NaN result stays NaN (quiet).
// - Integer Sum/Prod wrap around on overflow, as numpy does.
// - Min/Max do not depend on the operands' order: a NaN in either operand
//   gives NaN (as torch.minimum/maximum), and of -0 and +0 Min gives -0 and
//   Max +0.
// - dst may be a or b (the same address); other overlaps are not allowed.
//   dst2, when not null, receives the same result.
// - streaming=true writes dst with non-temporal stores (dst2 always uses
//   ordinary stores: it is a staging slot a peer reads next) and fences
//   before returning. Needs dst aligned to the element size (else ordinary
//   stores) and the AVX2 kernels (the portable ones store normally).
// Throws InvalidArgument for an unknown dtype/op, or null buffers when
// count > 0.
void reduce(void* dst, void* dst2, const void* a, const void* b, size_t count, DataType dtype,
            ReduceOp op, int divisor, bool streaming);

// dst[i] = src[i] / divisor for i < count, with the rounding rules above.
// dst may alias src. Throws InvalidArgument unless divisor > 0.
void divide(void* dst, const void* src, size_t count, DataType dtype, int divisor);

// memcpy of `bytes` into dst and, when not null, into dst2 in one pass over
// src; streaming=true as in reduce() (any dst alignment). No overlaps.
void copy(void* dst, void* dst2, const void* src, size_t bytes, bool streaming);

}  // namespace weft::reduce
