// The nccl transport: GPU collectives of a weft Communicator over NCCL, one
// NCCL communicator per (Communicator, device), bootstrapped through the
// Communicator itself (rank 0's ncclUniqueId goes out with its broadcast).
// Two forms over the same kind of communicator:
// - native: NCCL's own allreduce, broadcast, reduce, allgather and
//   reduce_scatter, for every weft dtype and op;
// - plans: weft's Plans (ring, tree, recursive doubling/halving, ...; the
//   ones the CPU executor runs) with ncclSend/ncclRecv as the data path and
//   weft's CUDA kernels for the reductions (exec/group_schedule.h).
// Calls return once the work is queued on the caller's stream (as NCCL's
// do); a watchdog aborts the NCCL communicator and fails the Communicator
// when an operation is not done within its timeout or NCCL reports an
// asynchronous error, so that no rank waits forever on a failed peer.
//
// No CUDA or NCCL type crosses this header, and it is usable in a build
// without NCCL: why_not_usable() and open() then say so.
#pragma once

#include <memory>
#include <string>

#include "core/common/config.h"
#include "core/device/device_collectives.h"

namespace weft {

class Communicator;

namespace nccl {

// The version of the NCCL library in use ("2.21.5"), or "" when weft was
// built without NCCL.
std::string version();

// Why `comm` cannot use NCCL on `device` ("" when it can): weft built
// without CUDA or NCCL, or ranks sharing a GPU (NCCL refuses duplicate
// GPUs; the ranks exchange their GPUs' UUIDs). A collective when weft has
// NCCL: every rank calls it, in order with its other operations.
std::string why_not_usable(Communicator& comm, int device);

// Opens NCCL for `comm` on `device` in the given form (a collective). Throws
// Error "nccl unavailable: <why>" when why_not_usable() says so, and Error
// with NCCL's reason when initialization fails (TimeoutError past the
// communicator's timeout).
std::unique_ptr<DeviceCollectives> open(Communicator& comm, int device, NcclMode mode);

}  // namespace nccl
}  // namespace weft
