// Which GPU transport carries a device's CUDA tensors (WEFT_CUDA_PATH):
// nccl, cuda_ipc or, when neither serves the group, pinned host staging
// (null). The choice rests only on facts every rank sees alike (the build,
// the hosts, the GPUs of all ranks, exchanged by nccl::why_not_usable), so
// that all ranks take the same path.
#include "backend.h"
#include "core/common/config.h"
#include "core/common/log.h"
#include "core/device/cuda_ipc/cuda_ipc.h"
#include "core/device/nccl/nccl.h"
#include "errors.h"

namespace weft::backend {

DeviceCollectives* WeftBackend::collectives_for(c10::Device device) {
  try {
    if (config().cuda_path == CudaPath::Staging) return nullptr;
    std::lock_guard<std::mutex> lock(device_mutex_);
    auto it = device_paths_.find(device.index());
    if (it == device_paths_.end()) {
      it = device_paths_.emplace(device.index(), open_collectives(device.index())).first;
    }
    return it->second.get();
  } catch (...) {
    rethrow_as_torch_error(std::current_exception());
  }
}

std::unique_ptr<DeviceCollectives> WeftBackend::open_collectives(int device) {
  const Config& cfg = config();
  std::unique_ptr<DeviceCollectives> opened;
  if (cfg.cuda_path == CudaPath::Nccl) {
    opened = nccl::open(*comm_, device, cfg.nccl_mode);
  } else if (cfg.cuda_path == CudaPath::Ipc) {
    opened = cuda_ipc::open(*comm_, device);
  } else {
    // auto: nccl when every rank has a GPU of its own, else cuda_ipc on one
    // host (several ranks per GPU), else staging.
    const std::string why_not_nccl = nccl::why_not_usable(*comm_, device);
    const std::string why_not_ipc = cuda_ipc::why_not_usable(*comm_);
    if (why_not_nccl.empty()) {
      opened = nccl::open(*comm_, device, cfg.nccl_mode);
    } else if (why_not_ipc.empty()) {
      WEFT_LOG(Info, rank_, "CUDA tensors on device " << device << ": not nccl: " << why_not_nccl);
      opened = cuda_ipc::open(*comm_, device);
    } else {
      WEFT_LOG(Info, rank_,
               "CUDA tensors on device " << device << " through pinned host staging: not nccl: "
                                         << why_not_nccl << "; not cuda_ipc: " << why_not_ipc);
      return nullptr;
    }
  }
  WEFT_LOG(Info, rank_, "CUDA tensors on device " << device << " over " << opened->name());
  return opened;
}

}  // namespace weft::backend
