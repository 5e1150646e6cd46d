#include "schedule.h"

#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <vector>

#include "core/common/error.h"
#include "core/exec/group_schedule.h"
#include "plan_export.h"

namespace py = pybind11;

namespace weft::python {
namespace {

const char* region_name(group::Region r) {
  switch (r) {
    case group::Region::Input: return "input";
    case group::Region::Output: return "output";
    case group::Region::Scratch: return "scratch";
    case group::Region::Temp0: return "temp0";
    case group::Region::Temp1: return "temp1";
  }
  return "?";
}

py::tuple ref(const group::Ref& r) { return py::make_tuple(region_name(r.region), r.offset); }

}  // namespace

void bind_schedule(py::module_& m) {
  m.def(
      "group_schedule",
      [](const std::string& collective, const std::string& algorithm, int rank, int size,
         size_t count, size_t elem_size, int root, bool in_place, bool finalize,
         std::optional<size_t> input_in_output, size_t max_step_bytes, std::vector<int> hosts,
         int max_inputs, std::vector<int> shared_cpu) {
        const Plan plan = build_plan({collective, algorithm, rank, size, count, elem_size, root,
                                      in_place, finalize, max_step_bytes, std::move(hosts),
                                      std::move(shared_cpu), false, 1});
        const group::Schedule s = group::schedule(plan, elem_size, input_in_output, max_inputs);
        py::list actions;
        for (const group::Action& a : s.actions) {
          if (a.kind == group::Action::Kind::Batch) {
            py::list transfers;
            for (const group::Transfer& t : a.transfers) {
              transfers.append(
                  py::make_tuple(t.send ? "send" : "recv", t.peer, ref(t.at), t.bytes));
            }
            actions.append(py::make_tuple("batch", transfers));
          } else {
            py::list srcs;
            for (const group::Ref& r : a.srcs) srcs.append(ref(r));
            actions.append(py::make_tuple("reduce", ref(a.dst), srcs, a.count, a.finalize));
          }
        }
        py::dict out;
        out["algorithm"] = plan.algorithm;
        out["scratch_bytes"] = plan.scratch_count * elem_size;
        out["temp_bytes"] = s.temp_bytes;
        out["actions"] = actions;
        return out;
      },
      py::arg("collective"), py::arg("algorithm"), py::arg("rank"), py::arg("size"),
      py::arg("count"), py::arg("elem_size"), py::arg("root") = 0, py::arg("in_place") = false,
      py::arg("finalize") = false, py::arg("input_in_output") = std::nullopt,
      py::arg("max_step_bytes") = 1 << 20, py::arg("hosts") = std::vector<int>{},
      py::arg("max_inputs") = 16, py::arg("shared_cpu") = std::vector<int>{},
      "Rank `rank`'s Plan of `collective` in family `algorithm` as the nccl transport runs it: "
      "dict(algorithm, scratch_bytes, temp_bytes, actions), each action ('batch', [(kind, peer, "
      "(region, offset), bytes)]) or ('reduce', dst, srcs, count, finalize). `shared_cpu` "
      "(Communicator.shared_cpu) shapes the Plans of CPU ranks that take turns on CPUs, which "
      "the nccl transport never runs: it lets their Plans be replayed here.");
}

}  // namespace weft::python
