#include "core/common/types.h"

#include "core/common/error.h"

namespace weft {

size_t element_size(DataType dtype) {
  switch (dtype) {
    case DataType::Float32:
    case DataType::Int32: return 4;
    case DataType::Float64:
    case DataType::Int64: return 8;
    case DataType::Float16:
    case DataType::BFloat16: return 2;
    case DataType::Int8:
    case DataType::UInt8: return 1;
  }
  throw InvalidArgument("unknown DataType");
}

const char* to_string(DataType dtype) {
  switch (dtype) {
    case DataType::Float32: return "float32";
    case DataType::Float64: return "float64";
    case DataType::Float16: return "float16";
    case DataType::BFloat16: return "bfloat16";
    case DataType::Int8: return "int8";
    case DataType::UInt8: return "uint8";
    case DataType::Int32: return "int32";
    case DataType::Int64: return "int64";
  }
  return "unknown";
}

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Prod: return "prod";
    case ReduceOp::Min: return "min";
    case ReduceOp::Max: return "max";
    case ReduceOp::Avg: return "avg";
  }
  return "unknown";
}

DataType parse_data_type(const std::string& name) {
  for (int i = 0; i < kNumDataTypes; ++i) {
    auto dtype = static_cast<DataType>(i);
    if (name == to_string(dtype)) return dtype;
  }
  throw InvalidArgument("unsupported dtype '" + name +
                        "': use one of float32, float64, float16, bfloat16, int8, uint8, "
                        "int32, int64");
}

ReduceOp parse_reduce_op(const std::string& name) {
  for (int i = 0; i < kNumReduceOps; ++i) {
    auto op = static_cast<ReduceOp>(i);
    if (name == to_string(op)) return op;
  }
  throw InvalidArgument("unsupported reduce op '" + name + "': use sum, prod, min, max or avg");
}

}  // namespace weft
