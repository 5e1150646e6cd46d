// weft._C_torch: creates the weft c10d::Backend for torch.distributed (see
// weft/_backend.py, which registers it). Built with torch's pybind11, so the
// Backend and Store objects cross between this module and torch's bindings.
#include <torch/csrc/utils/pybind.h>

#include "backend.h"
#include "host_tensor_reader.h"

namespace py = pybind11;

PYBIND11_MODULE(_C_torch, m) {
  m.doc() = "weft as a torch.distributed backend";
  py::module_::import("torch.distributed");  // registers the c10d types used here
  m.def(
      "create_backend",
      [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, double timeout_s,
         const std::string& name) -> c10::intrusive_ptr<c10d::Backend> {
        return c10::make_intrusive<weft::backend::WeftBackend>(store, rank, size, timeout_s, name);
      },
      py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout_s"), py::arg("name"),
      py::call_guard<py::gil_scoped_release>(),
      "A weft Backend for one process group: connects to its peers through `store`.");
  m.def(
      "communicator_of",
      [](const c10::intrusive_ptr<c10d::Backend>& backend) {
        auto* weft_backend = dynamic_cast<weft::backend::WeftBackend*>(backend.get());
        if (weft_backend == nullptr) throw py::type_error("communicator_of: not a weft Backend");
        return py::capsule(&weft_backend->communicator(), "weft.Communicator");
      },
      py::arg("backend"),
      "The Backend's core Communicator, as a capsule for weft._C (WEFT_ALGO=file:); valid "
      "while the Backend lives.");
  // weft._C reads torch tensors through it (python/host_tensor.h).
  m.attr("host_tensor_reader") = weft::backend::host_tensor_reader_capsule();
}
