// weft._C_torch's side of python/host_tensor.h: the capsule it exports.
#pragma once

#include <pybind11/pybind11.h>

namespace weft::backend {

pybind11::capsule host_tensor_reader_capsule();

}  // namespace weft::backend
