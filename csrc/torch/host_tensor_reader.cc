#include "host_tensor_reader.h"

#include <torch/csrc/autograd/python_variable.h>

#include "python/host_tensor.h"
#include "tensors.h"

namespace weft::backend {
namespace {

bool read_host_tensor(PyObject* obj, python::HostTensor* out) {
  if (!THPVariable_Check(obj)) return false;
  const at::Tensor& tensor = THPVariable_Unpack(obj);
  // bool is the backend's alone: weft.Communicator refuses it.
  if (!tensor.defined() || !tensor.is_cpu() || tensor.layout() != at::kStrided ||
      !tensor.is_contiguous() || tensor.scalar_type() == at::kBool) {
    return false;
  }
  const std::optional<DataType> dtype = core_type_of(tensor.scalar_type());
  if (!dtype) return false;
  out->dtype = *dtype;
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
