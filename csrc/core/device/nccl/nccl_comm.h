// One NCCL communicator of a weft Communicator on one device, and the
// watchdog that keeps a failed peer from hanging its ranks. NCCL-only
// (WEFT_HAVE_NCCL): nccl.cc reaches it through the open_* functions below.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/common/cuda_check.h"
#include "core/device/device_collectives.h"

namespace weft {

class Communicator;

namespace nccl {

class NcclComm {
 public:
  // A collective over `comm`: rank 0 makes the unique id and broadcasts it,
  // then every rank initializes a nonblocking NCCL communicator on `device`
  // and waits (at most the communicator's timeout) until it is ready.
  NcclComm(Communicator& comm, int device);
  ~NcclComm();
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  Communicator& weft() const { return comm_; }
  int device() const { return device_; }
  int rank() const { return rank_; }
  int size() const { return size_; }

  // Runs `enqueue` (NCCL calls made through call(), kernels) with `device`
  // current (the caller's device is restored after) and the communicator
  // locked, then has the watchdog follow `stream` until the operation's work
  // there is done. An Error thrown inside fails the weft Communicator too;
  // after a failure every call throws AbortedError.
  template <class Enqueue>
  void run(const std::string& what, void* stream, Enqueue enqueue) {
    std::lock_guard<std::mutex> lock(mu_);
    check_healthy(what);
    DeviceGuard guard(device_);
    try {
      enqueue(handle_);
    } catch (const std::exception& e) {
      fail_locked(what + ": " + e.what());
      throw;
    }
    watch(what, stream);
  }

  // Checks what an NCCL call returned; a nonblocking call still in progress
  // is polled until it finishes (bounded by the timeout, then aborted).
  // Throws Error "nccl <what>: <NCCL's error and last message>".
  void call(ncclResult_t result, const std::string& what);

 private:
  struct Pending {
    cudaEvent_t done;
    std::string what;
    double deadline_s;  // steady-clock seconds
  };

  void check_healthy(const std::string& what) const;
  void watch(const std::string& what, void* stream);
  void watchdog();
  void fail_locked(const std::string& reason);
  std::string error_text(ncclResult_t result) const;

  Communicator& comm_;
  const int device_;
  const int rank_;
  const int size_;
  const double timeout_s_;
  ncclComm_t handle_ = nullptr;

  std::mutex mu_;  // the handle, the queue, the failure
  std::condition_variable wake_;
  std::deque<Pending> pending_;
  std::vector<cudaEvent_t> spare_events_;
  std::string failure_;  // why the communicator was aborted ("" while healthy)
  bool stopping_ = false;
  std::thread thread_;
};

// The forms of nccl.h's open().
std::unique_ptr<DeviceCollectives> open_native(std::shared_ptr<NcclComm> comm);
std::unique_ptr<DeviceCollectives> open_plans(std::shared_ptr<NcclComm> comm);

// NCCL's type for a weft dtype.
ncclDataType_t nccl_type(DataType dtype);

}  // namespace nccl
}  // namespace weft
