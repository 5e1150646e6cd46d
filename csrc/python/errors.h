// weft's errors in Python: weft._C.Error and its kinds, and the one place a
// C++ weft::Error becomes one of them.
#pragma once

#include <pybind11/pybind11.h>

#include <exception>

namespace weft::python {

// Adds Error, InvalidArgument, PeerError, TimeoutError and AbortedError to `m`
// and has pybind11 raise them for weft's C++ errors.
void bind_errors(pybind11::module_& m);

// Sets the Python error for `error` if it is a weft::Error; false otherwise.
bool set_weft_error(std::exception_ptr error);

}  // namespace weft::python
