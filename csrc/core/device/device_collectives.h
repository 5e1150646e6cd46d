// The collectives a GPU transport offers on device buffers (cuda_ipc, nccl).
// No CUDA type crosses this header: a stream is a cudaStream_t as void*.
#pragma once

#include <cstddef>

#include "core/common/types.h"

namespace weft {

// GPU collectives of one communicator on one device. Buffers are device
// memory of that device; counts are elements of `dtype` (bytes for the data
// movements). The work is enqueued on `stream` (a cudaStream_t of the
// device); every rank of the communicator must make the same calls, in the
// same order as its other operations. Whether a call returns once the work
// is done (cuda_ipc) or once it is queued (nccl) is the transport's: either
// way the caller orders later work after `stream` and keeps the buffers
// alive until the stream has passed the operation. An error names the
// operation and leaves the communicator failed (the peers fail too).
class DeviceCollectives {
 public:
  virtual ~DeviceCollectives() = default;

  // The transport and form, for logs: "cuda_ipc", "nccl", "nccl plans".
  virtual const char* name() const = 0;
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

}  // namespace weft
