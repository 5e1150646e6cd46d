// Registers weft._C.group_schedule: a rank's Plan as the nccl transport's
// Plan executor runs it (core/exec/group_schedule.h), for tests that replay
// every rank's schedule on the host. Built in every build: no CUDA needed.
#pragma once

#include <pybind11/pybind11.h>

namespace weft::python {

void bind_schedule(pybind11::module_& m);

}  // namespace weft::python
