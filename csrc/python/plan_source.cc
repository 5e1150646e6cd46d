#include "plan_source.h"

#include <memory>
#include <optional>
#include <string>

#include "core/algo/families.h"
#include "core/comm.h"
#include "core/common/error.h"
#include "plan_export.h"

namespace py = pybind11;

namespace weft::python {
namespace {

// Holds the Python function for the communicator, which may outlive the call
// that installed it and be destroyed on a thread without the GIL.
struct Source {
  py::object function;
  ~Source() {
    if (!Py_IsInitialized()) {
      function.release();  // the interpreter is gone: nothing left to free it with
      return;
    }
    py::gil_scoped_acquire gil;
    function = py::object();
  }
};

}  // namespace

void bind_plan_source(py::module_& topo) {
  topo.def(
      "set_plan_source",
      [](py::capsule communicator, const std::string& collective, py::object function) {
        if (std::string(communicator.name()) != "weft.Communicator") {
          throw InvalidArgument("set_plan_source: not a weft communicator capsule");
        }
        auto source = std::make_shared<Source>();
        source->function = std::move(function);
        communicator.get_pointer<Communicator>()->set_plan_source(
            parse_collective(collective),
            [source](const Communicator::PlanQuery& q) -> std::optional<Plan> {
              py::gil_scoped_acquire gil;
              py::object plan = source->function(q.count, q.elem_size, q.root, q.in_place, q.avg,
                                                 q.slot_bytes, q.slots);
              if (plan.is_none()) return std::nullopt;
              return import_plan(plan.cast<py::dict>());
            });
      },
      py::arg("communicator"), py::arg("collective"), py::arg("function"),
      "Every later call of `collective` on the communicator (a capsule from "
      "weft._C_torch.communicator_of) asks function(count, elem_size, root, in_place, avg, "
      "slot_bytes, slots) for this rank's Plan (a dict in weft._C.topo.plan's form) and runs it, "
      "or the built-in choice where it returns None.");
}

}  // namespace weft::python
