// Plans as Python data, both ways: weft._C.topo.plan gives one rank's Plan
// of a built-in algorithm as a dict, for weft.topo to inspect and check;
// import_plan() turns such a dict back into a Plan for Communicator.run_plan.
// build_plan() is the one place the bindings turn (collective, family,
// world) into a Plan.
#pragma once

#include <pybind11/pybind11.h>

#include <string>
#include <vector>

#include "core/algo/plan.h"

namespace weft::python {

struct PlanRequest {
  std::string collective;  // allreduce ... barrier, or alltoall, gather, scatter (direct)
  std::string algorithm;   // a family, or auto (the collective's default)
  int rank = 0;
  int size = 1;
  size_t count = 0;
  size_t elem_size = 4;
  int root = 0;
  bool in_place = false;
  bool finalize = false;
  size_t max_step_bytes = 1 << 20;
  std::vector<int> hosts;       // host index per rank; empty: one host
  std::vector<int> shared_cpu;  // Communicator.shared_cpu; empty: none
  bool buffered_sends = true;
  int channels = 1;  // PlanContext::channels
};

// Throws InvalidArgument for an unknown name or lists of the wrong length.
Plan build_plan(const PlanRequest& request);
// The same in two halves, for a caller making every rank's Plan of one world:
// the checked context of request.rank, then the Plan for ctx.rank (the
// request's collective, family and sizes).
PlanContext plan_context(const PlanRequest& request);
Plan build_plan(const PlanRequest& request, const PlanContext& ctx);

// The dict weft._C.topo.plan returns (or one in its form) back into a Plan;
// throws InvalidArgument naming the key that is missing or malformed. What
// the steps say is checked later, against the buffers (algo::validate).
Plan import_plan(const pybind11::dict& plan);

void bind_plan_export(pybind11::module_& topo);

}  // namespace weft::python
