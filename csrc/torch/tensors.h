// How torch tensors reach the core: element types and reductions, byte views
// and packed buffers for lists of tensors.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include "core/common/types.h"

namespace weft::backend {

// How one reduction runs: natively in the core (dtype, op), or, for what the
// core has no kernel for (bitwise ops), by gathering every contribution and
// reducing locally.
struct Reduction {
  bool native;
  DataType dtype;
  ReduceOp op;  // native only
};

// The core's element type for a torch type (bool travels as uint8), or
// nullopt for types the core has no kernels for.
std::optional<DataType> core_type_of(at::ScalarType type);

// Refuses, as gloo does, PREMUL_SUM, bitwise ops on floating types and
// element types without reduction kernels.
Reduction plan_reduction(at::ScalarType type, const c10d::ReduceOp& op);

// Reduces the contributions stacked along dim 0 of `gathered` with `op`
// (not AVG: the core averages, and lists of tensors refuse it).
at::Tensor reduce_locally(const at::Tensor& gathered, const c10d::ReduceOp& op);

// The memory of a contiguous tensor as a flat uint8 tensor (no copy; it
// holds a reference to the storage, so the memory outlives the tensor).
at::Tensor bytes_of(const at::Tensor& tensor);

// The tensors' bytes back to back: a view when they already lie that way in
// one storage (holding a reference to it), else a new buffer, holding their
// contents when `copy_in`.
at::Tensor packed_bytes(at::TensorList tensors, bool copy_in);

// Copies `packed` (from packed_bytes) into the tensors, unless it is a view
// of them already.
void unpack_bytes(const at::Tensor& packed, at::TensorList tensors);

// Every tensor on the CPU; `what` names the operation.
void check_cpu(at::TensorList tensors, const char* what);

}  // namespace weft::backend
