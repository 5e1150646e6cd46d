// Element types and reduction operators understood by every layer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace weft {

enum class DataType : uint8_t {
  Float32,
  Float64,
  Float16,
  BFloat16,
  Int8,
  UInt8,
  Int32,
  Int64,
};
constexpr int kNumDataTypes = 8;

enum class ReduceOp : uint8_t { Sum, Prod, Min, Max, Avg };
constexpr int kNumReduceOps = 5;

size_t element_size(DataType dtype);
const char* to_string(DataType dtype);
const char* to_string(ReduceOp op);

// Parses names such as "float32", "bfloat16", "int64" (and numpy's "f4"-style
// codes are mapped by the bindings, not here). Throws InvalidArgument.
DataType parse_data_type(const std::string& name);
ReduceOp parse_reduce_op(const std::string& name);

}  // namespace weft
