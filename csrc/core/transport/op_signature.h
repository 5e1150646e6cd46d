// What a message says about the operation it belongs to: a 64-bit signature,
// the operation's sequence number in the high half and a hash of what it is
// (collective, algorithm, dtype, reduce op, size, root) in the low half. Receivers
// compare it with their own to catch ranks that are out of step.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/common/types.h"

namespace weft {

// `agreed_bytes`: a size every rank has alike for this operation (0 when
// there is none, as for alltoall's per-rank counts); `root`: the
// collective's root (0 where it has none).
uint64_t op_signature(uint64_t seq, const char* collective, const std::string& algorithm,
                      DataType dtype, ReduceOp op, size_t agreed_bytes, int root);

// Why a message tagged `theirs` cannot belong to operation `ours`.
std::string op_mismatch(uint64_t ours, uint64_t theirs);
// Why a message of `sent` bytes cannot be the one of `expected` bytes.
std::string length_mismatch(size_t expected, size_t sent);

}  // namespace weft
