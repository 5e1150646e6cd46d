// weft._C.topo.set_plan_source: makes a torch backend's communicator run the
// Plans a Python function gives for one collective (WEFT_ALGO=file:; see
// weft/topo/file_algo.py).
#pragma once

#include <pybind11/pybind11.h>

namespace weft::python {

void bind_plan_source(pybind11::module_& topo);

}  // namespace weft::python
