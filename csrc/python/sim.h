// Registers weft._C.sim: the event simulator of Plans on a network.
#pragma once

#include <pybind11/pybind11.h>

namespace weft::python {

void bind_sim(pybind11::module_& m);

}  // namespace weft::python
