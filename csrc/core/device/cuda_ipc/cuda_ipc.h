// The cuda_ipc transport: collectives on GPU buffers between the ranks of
// one host. Each rank keeps a device staging buffer per device, exports it
// with cudaIpcGetMemHandle and maps every peer's (cudaIpcOpenMemHandle), so
// weft's CUDA kernels read and write the peers' buffers directly. Ranks on
// different GPUs of the host and several ranks on one GPU both work.
//
// Its collectives (device_collectives.h) return once the operation is done
// on every rank. No CUDA type crosses this header, and it is usable in a
// build without CUDA: open() then says so.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "core/device/device_collectives.h"

namespace weft {

class Communicator;

namespace cuda_ipc {

// Why `comm` cannot use cuda_ipc ("" when it can): weft built without CUDA,
// ranks on several hosts, or more ranks than one kernel takes inputs.
std::string why_not_usable(const Communicator& comm);

// Opens the staging of `comm` on `device` (a collective: every rank calls
// it). Throws Error "cuda_ipc unavailable: <why>" when why_not_usable() says
// so, and Error with CUDA's reason when CUDA IPC fails.
std::unique_ptr<DeviceCollectives> open(Communicator& comm, int device);

}  // namespace cuda_ipc
}  // namespace weft
