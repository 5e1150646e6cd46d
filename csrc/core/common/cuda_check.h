// CUDA runtime helpers shared by the core's .cu files (never included
// without WEFT_HAVE_CUDA): errors as weft::Error, and a scoped device.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "core/common/error.h"

namespace weft {

// Throws Error "<what> failed: <CUDA's error string>" unless err is success.
inline void check_cuda(cudaError_t err, const std::string& what) {
  if (err != cudaSuccess) {
    throw Error(what + " failed: " + cudaGetErrorString(err));
  }
}

// Makes `device` current; restores the calling thread's device on scope exit.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    check_cuda(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device) check_cuda(cudaSetDevice(device), "cudaSetDevice");
    device_ = device;
  }
  ~DeviceGuard() {
    if (previous_ != device_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  int device_ = 0;
};

}  // namespace weft
