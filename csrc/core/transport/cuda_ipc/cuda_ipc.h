// The cuda_ipc transport: collectives on GPU buffers between the ranks of
// one host. Each rank keeps a device staging buffer per device, exports it
// with cudaIpcGetMemHandle and maps every peer's (cudaIpcOpenMemHandle), so
// weft's CUDA kernels read and write the peers' buffers directly. Ranks on
// different GPUs of the host and several ranks on one GPU both work.
//
// No CUDA type crosses this header (a stream is a cudaStream_t as void*), and
// it is usable in a build without CUDA: open_cuda_ipc() then says so.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "core/common/types.h"

namespace weft {

class Communicator;

namespace cuda_ipc {

// GPU collectives of one communicator on one device. Buffers are device
// memory of that device; counts are elements of `dtype` (bytes for the data
// movements). The work is enqueued on `stream` (a cudaStream_t of the device)
// and the call returns once it is done on every rank: each call is blocking,
// and every rank of the communicator must make it, in the same order as its
// other operations. An error aborts the communicator (the peers fail too).
class CudaIpc {
 public:
  virtual ~CudaIpc() = default;

  // out = the reduction of every rank's in (in == out: in place).
  virtual void allreduce(const void* in, void* out, size_t count, DataType dtype, ReduceOp op,
                         void* stream) = 0;
  // root's buf (bytes) into every rank's buf.
  virtual void broadcast(void* buf, size_t bytes, int root, void* stream) = 0;
  // out (size * bytes) = every rank's in (bytes), in rank order; in may be
  // out's block `rank`.
  virtual void allgather(const void* in, void* out, size_t bytes, void* stream) = 0;
  // in: size * count elements; out (count) = the reduction of block `rank`.
  virtual void reduce_scatter(const void* in, void* out, size_t count, DataType dtype, ReduceOp op,
                              void* stream) = 0;
  // out at the root = the reduction of every rank's in; others' out untouched.
  virtual void reduce(const void* in, void* out, size_t count, DataType dtype, ReduceOp op,
                      int root, void* stream) = 0;
};

// Why `comm` cannot use cuda_ipc ("" when it can): weft built without CUDA,
// ranks on several hosts, or more ranks than one kernel takes inputs.
std::string why_not_usable(const Communicator& comm);

// Opens the staging of `comm` on `device` (a collective: every rank calls
// it). Throws Error "cuda_ipc unavailable: <why>" when why_not_usable() says
// so, and Error with CUDA's reason when CUDA IPC fails.
std::unique_ptr<CudaIpc> open(Communicator& comm, int device);

}  // namespace cuda_ipc
}  // namespace weft
