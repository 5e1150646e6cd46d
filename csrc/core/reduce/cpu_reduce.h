// Element-wise reduction and copy loops for host memory. They are the only
// place that touches payload bytes on the CPU, so they are written to
// vectorize (AVX2 when the CPU has it, chosen at run time) and can use
// non-temporal stores for destinations that will not be read again soon.
#pragma once

#include <cstddef>

#include "core/common/types.h"

namespace weft::reduce {

// dst[i] = a[i] (op) b[i] for i < count.
// - ReduceOp::Avg reduces like Sum; the division happens where `divisor` > 0:
//   the result is then divided by `divisor` (integers truncate toward zero).
// - float16/bfloat16 are widened to float32, reduced (and divided), rounded
//   once to nearest-even.
// - Integer Sum/Prod wrap around on overflow, as numpy does.
// - dst may alias a or b. dst2, when not null, receives the same result.
// - streaming=true writes dst with non-temporal stores (dst2 always uses
//   ordinary stores: it is a staging slot a peer reads next) and fences
//   before returning.
void reduce(void* dst, void* dst2, const void* a, const void* b, size_t count, DataType dtype,
            ReduceOp op, int divisor, bool streaming);

// dst[i] = src[i] / divisor for i < count, with the rounding rules above.
// dst may alias src.
void divide(void* dst, const void* src, size_t count, DataType dtype, int divisor);

// memcpy of `bytes` into dst and, when not null, into dst2 in one pass over
// src; streaming=true as in reduce().
void copy(void* dst, void* dst2, const void* src, size_t bytes, bool streaming);

}  // namespace weft::reduce
