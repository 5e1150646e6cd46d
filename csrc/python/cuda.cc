#include "cuda.h"

#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/device/nccl/nccl.h"
#include "core/reduce/cuda_reduce.h"

namespace py = pybind11;

namespace weft::python {

void bind_cuda(py::module_& m) {
  py::module_ cuda = m.def_submodule("cuda", "The CUDA kernels on raw device pointers.");
  cuda.def("device_count", &reduce::cuda::device_count,
           "The number of CUDA devices; raises weft.Error when there is none.");
  cuda.def(
      "reduce",
      [](uintptr_t dst, const std::vector<uintptr_t>& srcs, size_t count, const std::string& dtype,
         const std::string& op, int divisor, uintptr_t dst2, int device, uintptr_t stream) {
        const DataType type = parse_data_type(dtype);
        const ReduceOp rop = parse_reduce_op(op);
        std::vector<const void*> inputs;
        for (uintptr_t p : srcs) inputs.push_back(reinterpret_cast<const void*>(p));
        py::gil_scoped_release nogil;
        reduce::cuda::reduce(reinterpret_cast<void*>(dst), reinterpret_cast<void*>(dst2),
                             inputs.data(), static_cast<int>(inputs.size()), count, type, rop,
                             divisor, device, reinterpret_cast<void*>(stream));
      },
      py::arg("dst"), py::arg("srcs"), py::arg("count"), py::arg("dtype"), py::arg("op") = "sum",
      py::kw_only(), py::arg("divisor") = 0, py::arg("dst2") = 0, py::arg("device") = 0,
      py::arg("stream") = 0,
      "Enqueues dst (and dst2 when not 0) = the reduction of `count` elements of every srcs "
      "pointer on `stream` of `device`; returns without waiting.");
  cuda.attr("MAX_INPUTS") = reduce::cuda::kMaxInputs;
  cuda.def("nccl_version", &nccl::version,
           "The version of the NCCL library weft uses (\"2.21.5\"), or \"\" when weft was "
           "built without NCCL.");
}

}  // namespace weft::python
