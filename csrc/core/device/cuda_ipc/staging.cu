#include <cuda_runtime.h>

#include <cstring>
#include <string>

#include "core/comm.h"
#include "core/common/cuda_check.h"
#include "core/common/log.h"
#include "core/device/cuda_ipc/staging.h"

namespace weft::cuda_ipc {
namespace {

// Allocations are rounded up to this, so that growing sizes rarely reallocate.
constexpr size_t kGranule = 2 << 20;

// What each rank publishes about its buffer.
struct Exported {
  cudaIpcMemHandle_t handle;
  char bus_id[32];  // PCI bus id of its GPU, to find it among this process's devices
};

void check(cudaError_t err, const std::string& what) { check_cuda(err, "cuda_ipc: " + what); }

}  // namespace

Staging::Staging(Communicator& comm, int device)
    : comm_(comm), device_(device), buffers_(comm.size(), nullptr) {}

Staging::~Staging() {
  int previous = 0;
  if (cudaGetDevice(&previous) != cudaSuccess) previous = device_;
  cudaSetDevice(device_);
  release();
  cudaSetDevice(previous);
}

void Staging::reserve(size_t bytes) {
  if (bytes <= bytes_) return;
  release();
  const size_t rounded = (bytes + kGranule - 1) / kGranule * kGranule;
  void* mine = nullptr;
  check(cudaMalloc(&mine, rounded), "cudaMalloc of " + std::to_string(rounded) + " bytes");
  buffers_[comm_.rank()] = static_cast<char*>(mine);
  exchange_handles();
  bytes_ = rounded;
  WEFT_LOG(Info, comm_.rank(),
           "cuda_ipc: staging of " << rounded << " bytes per rank on device " << device_);
}

void Staging::exchange_handles() {
  const int me = comm_.rank();
  const int size = comm_.size();
  Exported mine{};
  const cudaError_t err = cudaIpcGetMemHandle(&mine.handle, buffers_[me]);
  if (err != cudaSuccess) {
    throw Error(std::string("cuda_ipc unavailable: cudaIpcGetMemHandle failed: ") +
                cudaGetErrorString(err) +
                " (CUDA IPC needs a driver and device that allow it; WEFT_CUDA_PATH=staging "
                "moves CUDA tensors through host memory instead)");
  }
  check(cudaDeviceGetPCIBusId(mine.bus_id, sizeof(mine.bus_id), device_), "cudaDeviceGetPCIBusId");
  std::vector<Exported> all(size);
  comm_.allgather(&mine, all.data(), sizeof(Exported), DataType::UInt8, /*async=*/false);
  for (int r = 0; r < size; ++r) {
    if (r == me) continue;
    const std::string peer = "rank " + std::to_string(r) + "'s GPU " + all[r].bus_id;
    if (std::strncmp(all[r].bus_id, mine.bus_id, sizeof(mine.bus_id)) != 0) {
      int peer_device = -1;
      if (cudaDeviceGetByPCIBusId(&peer_device, all[r].bus_id) != cudaSuccess) {
        cudaGetLastError();  // not sticky: clear it
        throw Error("cuda_ipc unavailable: " + peer +
                    " is not visible to this process (CUDA_VISIBLE_DEVICES?)");
      }
      int can = 0;
      check(cudaDeviceCanAccessPeer(&can, device_, peer_device), "cudaDeviceCanAccessPeer");
      if (!can) {
        throw Error("cuda_ipc unavailable: GPU " + std::string(mine.bus_id) + " cannot access " +
                    peer + " (no peer-to-peer path); WEFT_CUDA_PATH=staging avoids it");
      }
    }
    void* mapped = nullptr;
    check(cudaIpcOpenMemHandle(&mapped, all[r].handle, cudaIpcMemLazyEnablePeerAccess),
          "cudaIpcOpenMemHandle of " + peer);
    buffers_[r] = static_cast<char*>(mapped);
  }
}

void Staging::release() noexcept {
  const int me = comm_.rank();
  for (size_t r = 0; r < buffers_.size(); ++r) {
    if (!buffers_[r]) continue;
    if (static_cast<int>(r) == me) {
      cudaFree(buffers_[r]);
    } else {
      cudaIpcCloseMemHandle(buffers_[r]);
    }
    buffers_[r] = nullptr;
  }
  cudaGetLastError();  // a failure here has nobody to report to: clear it
  bytes_ = 0;
}

}  // namespace weft::cuda_ipc
