#include "tensors.h"

#include <cstdint>
#include <optional>
#include <string>

namespace weft::backend {
namespace {

const char* op_name(c10d::ReduceOp::RedOpType op) {
  switch (op) {
    case c10d::ReduceOp::SUM: return "SUM";
    case c10d::ReduceOp::AVG: return "AVG";
    case c10d::ReduceOp::PRODUCT: return "PRODUCT";
    case c10d::ReduceOp::MIN: return "MIN";
    case c10d::ReduceOp::MAX: return "MAX";
    case c10d::ReduceOp::BAND: return "BAND";
    case c10d::ReduceOp::BOR: return "BOR";
    case c10d::ReduceOp::BXOR: return "BXOR";
    case c10d::ReduceOp::PREMUL_SUM: return "PREMUL_SUM";
    default: return "UNUSED";
  }
}

ReduceOp core_op(c10d::ReduceOp::RedOpType op) {
  switch (op) {
    case c10d::ReduceOp::SUM: return ReduceOp::Sum;
    case c10d::ReduceOp::AVG: return ReduceOp::Avg;
    case c10d::ReduceOp::PRODUCT: return ReduceOp::Prod;
    case c10d::ReduceOp::MIN: return ReduceOp::Min;
    case c10d::ReduceOp::MAX: return ReduceOp::Max;
    default:
      // Bitwise ops on integers have no core reduction (plan_reduction marks
      // them not native): reaching here is a bug in the caller.
      TORCH_CHECK(false, "weft: ReduceOp.", op_name(op), " has no core reduction");
  }
}

// Booleans reduce as bytes 0/1: sum and max are "or", product and min "and".
ReduceOp bool_op(c10d::ReduceOp::RedOpType op) {
  switch (op) {
    case c10d::ReduceOp::SUM:
    case c10d::ReduceOp::MAX:
    case c10d::ReduceOp::BOR: return ReduceOp::Max;
    default: return ReduceOp::Min;
  }
}

}  // namespace

std::optional<DataType> core_type_of(at::ScalarType type) {
  switch (type) {
    case at::kFloat: return DataType::Float32;
    case at::kDouble: return DataType::Float64;
    case at::kHalf: return DataType::Float16;
    case at::kBFloat16: return DataType::BFloat16;
    case at::kChar: return DataType::Int8;
    case at::kByte: return DataType::UInt8;
    case at::kBool: return DataType::UInt8;
    case at::kInt: return DataType::Int32;
    case at::kLong: return DataType::Int64;
    default: return std::nullopt;
  }
}

Reduction plan_reduction(at::ScalarType type, const c10d::ReduceOp& op) {
  const auto kind = op.op_;
  TORCH_CHECK(kind != c10d::ReduceOp::PREMUL_SUM && kind != c10d::ReduceOp::UNUSED,
              "Cannot use ReduceOp.", op_name(kind), " with weft");
  const std::optional<DataType> dtype = core_type_of(type);
  TORCH_CHECK(dtype.has_value(), "Invalid scalar type");
  const bool bitwise =
      kind == c10d::ReduceOp::BAND || kind == c10d::ReduceOp::BOR || kind == c10d::ReduceOp::BXOR;
  TORCH_CHECK(!bitwise || !at::isFloatingType(type), "Cannot use ReduceOp.", op_name(kind),
              " with non-integral dtype");
  if (type == at::kBool) {
    TORCH_CHECK(kind != c10d::ReduceOp::AVG, "Cannot use ReduceOp.AVG with bool dtype");
    return {kind != c10d::ReduceOp::BXOR, *dtype, bool_op(kind)};
  }
  // Bitwise ops are gathered and reduced locally; `op` is then never read.
  if (bitwise) return {false, *dtype, ReduceOp::Sum};
  return {true, *dtype, core_op(kind)};
}

at::Tensor reduce_locally(const at::Tensor& gathered, const c10d::ReduceOp& op) {
  TORCH_CHECK(op.op_ != c10d::ReduceOp::AVG, "weft: AVG is never reduced locally");
  at::Tensor acc = gathered[0].clone();
  const int64_t n = gathered.size(0);
  for (int64_t i = 1; i < n; ++i) {
    const at::Tensor next = gathered[i];
    switch (op.op_) {
      case c10d::ReduceOp::SUM: acc.add_(next); break;
      case c10d::ReduceOp::PRODUCT: acc.mul_(next); break;
      case c10d::ReduceOp::MIN: at::minimum_out(acc, acc, next); break;
      case c10d::ReduceOp::MAX: at::maximum_out(acc, acc, next); break;
      case c10d::ReduceOp::BAND: acc.bitwise_and_(next); break;
      case c10d::ReduceOp::BOR: acc.bitwise_or_(next); break;
      default: acc.bitwise_xor_(next); break;
    }
  }
  return acc;
}

namespace {

// `bytes` bytes of `tensor`'s storage from its first element, as a uint8
// tensor holding a reference to that storage: an asynchronous operation that
// keeps only this view keeps the memory alive too (torch does not keep an
// async op's inputs alive for it).
at::Tensor storage_bytes(const at::Tensor& tensor, int64_t bytes) {
  at::Tensor view = at::empty({0}, at::TensorOptions().dtype(at::kByte));
  view.set_(tensor.storage(), tensor.storage_offset() * tensor.element_size(), {bytes}, {1});
  return view;
}

}  // namespace

at::Tensor bytes_of(const at::Tensor& tensor) {
  return storage_bytes(tensor, static_cast<int64_t>(tensor.nbytes()));
}

at::Tensor packed_bytes(at::TensorList tensors, bool copy_in) {
  int64_t total = 0;
  bool back_to_back = true;
  const char* base = tensors.empty() ? nullptr : static_cast<const char*>(tensors[0].data_ptr());
  for (const at::Tensor& t : tensors) {
    back_to_back = back_to_back && t.is_contiguous() && t.data_ptr() == base + total &&
                   t.storage().is_alias_of(tensors[0].storage());
    total += static_cast<int64_t>(t.nbytes());
  }
  if (back_to_back && !tensors.empty()) {
    return storage_bytes(tensors[0], total);
  }
  at::Tensor packed = at::empty({total}, at::TensorOptions().dtype(at::kByte));
  if (copy_in) {
    int64_t offset = 0;
    for (const at::Tensor& t : tensors) {
      const int64_t n = static_cast<int64_t>(t.nbytes());
      if (n == 0) continue;
      packed.narrow(0, offset, n).copy_(bytes_of(t.contiguous()));
      offset += n;
    }
  }
  return packed;
}

void unpack_bytes(const at::Tensor& packed, at::TensorList tensors) {
  const char* base = static_cast<const char*>(packed.data_ptr());
  int64_t offset = 0;
  for (const at::Tensor& t : tensors) {
    const int64_t n = static_cast<int64_t>(t.nbytes());
    if (n > 0 && t.data_ptr() != base + offset) {
      const at::Tensor src = packed.narrow(0, offset, n);
      if (t.is_contiguous()) {
        bytes_of(t).copy_(src);
      } else {
        const_cast<at::Tensor&>(t).copy_(src.view(t.scalar_type()).view(t.sizes()));
      }
    }
    offset += n;
  }
}

void check_cpu(at::TensorList tensors, const char* what) {
  for (const at::Tensor& t : tensors) {
    TORCH_CHECK(t.device().is_cpu(), "weft ", what, ": expected CPU tensors, got a tensor on ",
                t.device());
    TORCH_CHECK(t.layout() == at::kStrided, "weft ", what, ": only dense tensors are supported");
  }
}

}  // namespace weft::backend
