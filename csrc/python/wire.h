// Registers weft._C.wire: the bootstrap's parsers of bytes from the network
// and the Store, and its SHA-256/HMAC, for tests and fuzz targets.
#pragma once

#include <pybind11/pybind11.h>

namespace weft::python {

void bind_wire(pybind11::module_& m);

}  // namespace weft::python
