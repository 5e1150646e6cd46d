// Registers weft._C.cuda (the CUDA kernels on raw device pointers). Built only
// with CUDA (WEFT_HAVE_CUDA); without it weft._C has no "cuda" and weft.cuda
// says so.
#pragma once

#include <pybind11/pybind11.h>

namespace weft::python {

void bind_cuda(pybind11::module_& m);

}  // namespace weft::python
