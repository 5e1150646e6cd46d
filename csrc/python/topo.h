// Registers weft._C.topo (cost model, topologies, predictions).
#pragma once

#include <pybind11/pybind11.h>

namespace weft::python {

void bind_topo(pybind11::module_& m);

}  // namespace weft::python
