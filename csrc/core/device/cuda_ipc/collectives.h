// cuda_ipc's collectives over its Staging (see cuda_ipc.h for the contract).
// CUDA-only (WEFT_HAVE_CUDA): cuda_ipc.cc reaches it through open().
#pragma once

#include <memory>

#include "core/device/cuda_ipc/cuda_ipc.h"

namespace weft::cuda_ipc {

// An allreduce of at least this many bytes runs two-shot (each rank reduces
// its 1/n slice, then gathers the others' slices: every byte is read about
// twice), smaller ones one-shot (each rank reduces all n buffers: n reads per
// byte, but one round of barriers fewer). A first guess between the
// barrier's cost and HBM bandwidth, to be set from bench/gpu_allreduce.py.
constexpr size_t kTwoShotMinBytes = 256 << 10;

std::unique_ptr<DeviceCollectives> open_collectives(Communicator& comm, int device);

}  // namespace weft::cuda_ipc
