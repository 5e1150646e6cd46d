// weft._C.topo.plan: one rank's Plan of a built-in algorithm as Python data,
// for weft.topo to inspect and check every generator. build_plan() is the
// one place the bindings turn (collective, family, world) into a Plan.
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
};

// Throws InvalidArgument for an unknown name or lists of the wrong length.
Plan build_plan(const PlanRequest& request);

void bind_plan_export(pybind11::module_& topo);

}  // namespace weft::python
