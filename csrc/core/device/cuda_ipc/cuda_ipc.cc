#include "core/device/cuda_ipc/cuda_ipc.h"

#include "core/comm.h"
#include "core/common/error.h"
#include "core/device/cuda_ipc/collectives.h"
#include "core/reduce/cuda_reduce.h"

namespace weft::cuda_ipc {

std::string why_not_usable(const Communicator& comm) {
#ifndef WEFT_HAVE_CUDA
  (void)comm;
  return "weft was built without CUDA (nvcc was not found, or WEFT_CUDA=OFF)";
#else
  if (comm.topology().hosts != 1) {
    return "the ranks are on " + std::to_string(comm.topology().hosts) +
           " hosts; CUDA IPC needs them all on one";
  }
  if (comm.size() > reduce::cuda::kMaxInputs) {
    return std::to_string(comm.size()) + " ranks; it takes at most " +
           std::to_string(reduce::cuda::kMaxInputs) + " (inputs of one reduction kernel)";
  }
  return "";
#endif
}

std::unique_ptr<DeviceCollectives> open(Communicator& comm, int device) {
  const std::string why = why_not_usable(comm);
#ifdef WEFT_HAVE_CUDA
  if (why.empty()) return open_collectives(comm, device);
#else
  (void)device;
#endif
  throw Error("cuda_ipc unavailable: " + why);
}

}  // namespace weft::cuda_ipc
