// nccl.h's entry points, built in every build: without NCCL (or CUDA) they
// say so; with it they check the world and open the NCCL-only parts.
#include "core/device/nccl/nccl.h"

#include <cstring>
#include <vector>

#include "core/comm.h"
#include "core/common/error.h"

#ifdef WEFT_HAVE_NCCL
#include "core/common/cuda_check.h"
#include "core/device/nccl/nccl_comm.h"
#endif

namespace weft::nccl {

#ifdef WEFT_HAVE_NCCL

std::string version() {
  int code = 0;
  if (ncclGetVersion(&code) != ncclSuccess) return "unknown";
  // Codes since 2.9 are major * 10000 + minor * 100 + patch.
  return std::to_string(code / 10000) + "." + std::to_string(code / 100 % 100) + "." +
         std::to_string(code % 100);
}

namespace {

std::string hex(const unsigned char* bytes, size_t n) {
  static const char digits[] = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    out += digits[bytes[i] >> 4];
    out += digits[bytes[i] & 15];
  }
  return "GPU-" + out;
}

}  // namespace

std::string why_not_usable(Communicator& comm, int device) {
  cudaDeviceProp props;
  check_cuda(cudaGetDeviceProperties(&props, device),
             "nccl: cudaGetDeviceProperties of device " + std::to_string(device));
  constexpr size_t kUuid = sizeof(props.uuid.bytes);
  std::vector<unsigned char> all(kUuid * comm.size());
  comm.allgather(props.uuid.bytes, all.data(), kUuid, DataType::UInt8, /*async=*/false);
  for (int a = 0; a < comm.size(); ++a) {
    for (int b = a + 1; b < comm.size(); ++b) {
      if (std::memcmp(&all[a * kUuid], &all[b * kUuid], kUuid) == 0) {
        return "ranks " + std::to_string(a) + " and " + std::to_string(b) + " share GPU " +
               hex(&all[a * kUuid], kUuid) +
               "; NCCL needs a GPU of its own for every rank (cuda_ipc serves shared GPUs: "
               "WEFT_CUDA_PATH=ipc or auto)";
      }
    }
  }
  return "";
}

std::unique_ptr<DeviceCollectives> open(Communicator& comm, int device, NcclMode mode) {
  const std::string why = why_not_usable(comm, device);
  if (!why.empty()) throw Error("nccl unavailable: " + why);
  auto shared = std::make_shared<NcclComm>(comm, device);
  return mode == NcclMode::Plans ? open_plans(std::move(shared)) : open_native(std::move(shared));
}

#else

namespace {

std::string missing() {
#ifdef WEFT_HAVE_CUDA
  return "weft was built without NCCL (no nvidia-nccl-cu13 wheel, nor nccl.h and libnccl, when "
         "it was built)";
#else
  return "weft was built without CUDA (nvcc was not found, or WEFT_CUDA=OFF), hence without NCCL";
#endif
}

}  // namespace

std::string version() { return ""; }

std::string why_not_usable(Communicator&, int) { return missing(); }

std::unique_ptr<DeviceCollectives> open(Communicator&, int, NcclMode) {
  throw Error("nccl unavailable: " + missing());
}

#endif

}  // namespace weft::nccl
