#include "host_tensor_reader.h"

#include <torch/csrc/autograd/python_variable.h>

#include "python/host_tensor.h"

namespace weft::backend {
namespace {

// The element types weft.Communicator takes (bool is the backend's alone).
bool communicator_type(at::ScalarType type, DataType* out) {
  switch (type) {
    case at::kFloat: *out = DataType::Float32; return true;
    case at::kDouble: *out = DataType::Float64; return true;
    case at::kHalf: *out = DataType::Float16; return true;
    case at::kBFloat16: *out = DataType::BFloat16; return true;
    case at::kChar: *out = DataType::Int8; return true;
    case at::kByte: *out = DataType::UInt8; return true;
    case at::kInt: *out = DataType::Int32; return true;
    case at::kLong: *out = DataType::Int64; return true;
    default: return false;
  }
}

bool read_host_tensor(PyObject* obj, python::HostTensor* out) {
  if (!THPVariable_Check(obj)) return false;
  const at::Tensor& tensor = THPVariable_Unpack(obj);
  if (!tensor.defined() || !tensor.is_cpu() || tensor.layout() != at::kStrided ||
      !tensor.is_contiguous() || !communicator_type(tensor.scalar_type(), &out->dtype)) {
    return false;
  }
  out->data = tensor.data_ptr();
  out->count = static_cast<size_t>(tensor.numel());
  return true;
}

const python::HostTensorReader kReader{&read_host_tensor};

}  // namespace

pybind11::capsule host_tensor_reader_capsule() {
  return pybind11::capsule(&kReader, python::kHostTensorReaderCapsule);
}

}  // namespace weft::backend
