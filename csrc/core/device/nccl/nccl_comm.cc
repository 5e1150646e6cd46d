#include "core/device/nccl/nccl_comm.h"

#include <chrono>
#include <cstring>

#include "core/comm.h"
#include "core/common/cuda_check.h"
#include "core/common/deadline.h"
#include "core/common/error.h"
#include "core/common/log.h"

namespace weft::nccl {
namespace {

// How often a nonblocking call in progress and the watchdog look again.
constexpr auto kPoll = std::chrono::milliseconds(1);

}  // namespace

ncclDataType_t nccl_type(DataType dtype) {
  switch (dtype) {
    case DataType::Float32: return ncclFloat32;
    case DataType::Float64: return ncclFloat64;
    case DataType::Float16: return ncclFloat16;
    case DataType::BFloat16: return ncclBfloat16;
    case DataType::Int8: return ncclInt8;
    case DataType::UInt8: return ncclUint8;
    case DataType::Int32: return ncclInt32;
    case DataType::Int64: return ncclInt64;
  }
  throw InvalidArgument("nccl: unknown dtype");
}

NcclComm::NcclComm(Communicator& comm, int device)
    : comm_(comm),
      device_(device),
      rank_(comm.rank()),
      size_(comm.size()),
      timeout_s_(comm.timeout_s()) {
  DeviceGuard guard(device_);
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  if (rank_ == 0) call(ncclGetUniqueId(&id), "ncclGetUniqueId");
  comm_.broadcast(&id, sizeof(id), DataType::UInt8, 0, /*async=*/false);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // every call returns at once; call() polls, bounded by the timeout
  config.commName = "weft";
  const ncclResult_t result = ncclCommInitRankConfig(&handle_, size_, id, rank_, &config);
  if (result != ncclSuccess && result != ncclInProgress) {
    if (handle_) ncclCommAbort(handle_);
    handle_ = nullptr;
    throw Error("nccl ncclCommInitRankConfig on device " + std::to_string(device_) + ": " +
                ncclGetErrorString(result) + " (" + ncclGetLastError(nullptr) + ")");
  }
  call(result, "ncclCommInitRankConfig on device " + std::to_string(device_));
  WEFT_LOG(Info, rank_, "nccl: communicator of " << size_ << " ranks ready on device " << device_);
}

NcclComm::~NcclComm() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  int previous = 0;
  if (cudaGetDevice(&previous) != cudaSuccess) previous = device_;
  cudaSetDevice(device_);
  if (handle_) {
    bool finalized = false;
    if (failure_.empty()) {
      try {
        call(ncclCommFinalize(handle_), "ncclCommFinalize");
        finalized = true;
      } catch (const Error&) {
      }
    }
    if (!finalized || ncclCommDestroy(handle_) != ncclSuccess) ncclCommAbort(handle_);
  }
  for (const Pending& p : pending_) cudaEventDestroy(p.done);
  for (cudaEvent_t e : spare_events_) cudaEventDestroy(e);
  cudaGetLastError();  // nothing to report to here
  cudaSetDevice(previous);
}

std::string NcclComm::error_text(ncclResult_t result) const {
  std::string text = ncclGetErrorString(result);
  const char* last = ncclGetLastError(handle_);
  if (last != nullptr && last[0] != '\0') text += std::string(" (") + last + ")";
  return text;
}

void NcclComm::call(ncclResult_t result, const std::string& what) {
  const double deadline = now_s() + timeout_s_;
  while (result == ncclInProgress) {
    if (now_s() > deadline) {
      // Aborting is the only way out of a call in progress; run() then fails
      // the weft Communicator.
      if (handle_) ncclCommAbort(handle_);
      handle_ = nullptr;
      throw TimeoutError("nccl " + what + " on rank " + std::to_string(rank_) +
                         ": not finished after " + std::to_string(timeout_s_) +
                         " s (WEFT_TIMEOUT_S); the NCCL communicator was aborted");
    }
    std::this_thread::sleep_for(kPoll);
    ncclResult_t state = ncclSuccess;
    const ncclResult_t asked = ncclCommGetAsyncError(handle_, &state);
    result = asked != ncclSuccess ? asked : state;
  }
  if (result != ncclSuccess) {
    throw Error("nccl " + what + " on rank " + std::to_string(rank_) + ": " + error_text(result));
  }
}

void NcclComm::check_healthy(const std::string& what) const {
  if (!failure_.empty()) {
    throw AbortedError("nccl " + what + ": the NCCL communicator was aborted earlier: " + failure_);
  }
}

void NcclComm::watch(const std::string& what, void* stream) {
  cudaEvent_t done = nullptr;
  if (!spare_events_.empty()) {
    done = spare_events_.back();
    spare_events_.pop_back();
  } else {
    check_cuda(cudaEventCreateWithFlags(&done, cudaEventDisableTiming),
               "nccl " + what + ": cudaEventCreate");
  }
  check_cuda(cudaEventRecord(done, static_cast<cudaStream_t>(stream)),
             "nccl " + what + ": cudaEventRecord");
  pending_.push_back(Pending{done, what, now_s() + timeout_s_});
  if (!thread_.joinable()) thread_ = std::thread([this] { watchdog(); });
  wake_.notify_one();
}

void NcclComm::watchdog() {
  cudaSetDevice(device_);
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    wake_.wait(lock, [this] { return stopping_ || !pending_.empty(); });
    if (stopping_) return;
    if (!failure_.empty()) {  // nothing left to watch: the events complete on their own
      for (const Pending& p : pending_) cudaEventDestroy(p.done);
      pending_.clear();
      continue;
    }
    while (!pending_.empty()) {
      const cudaError_t state = cudaEventQuery(pending_.front().done);
      if (state == cudaErrorNotReady) break;
      if (state != cudaSuccess && failure_.empty()) {
        fail_locked("nccl " + pending_.front().what + ": " + cudaGetErrorString(state));
      }
      spare_events_.push_back(pending_.front().done);
      pending_.pop_front();
    }
    if (pending_.empty() || !failure_.empty()) continue;
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(handle_, &async);
    if (async != ncclSuccess && async != ncclInProgress) {
      fail_locked("nccl " + pending_.front().what + " on rank " + std::to_string(rank_) + ": " +
                  error_text(async));
    } else if (now_s() > pending_.front().deadline_s) {
      fail_locked("nccl " + pending_.front().what + " on rank " + std::to_string(rank_) +
                  ": not done on the GPU after " + std::to_string(timeout_s_) +
                  " s (WEFT_TIMEOUT_S); a peer may have failed");
    }
    if (!failure_.empty()) continue;
    lock.unlock();
    std::this_thread::sleep_for(kPoll);
    lock.lock();
  }
}

void NcclComm::fail_locked(const std::string& reason) {
  if (!failure_.empty()) return;
  failure_ = reason;
  WEFT_LOG(Info, rank_, reason << "; aborting the NCCL communicator");
  if (handle_) ncclCommAbort(handle_);
  handle_ = nullptr;
  comm_.abort(reason);
}

}  // namespace weft::nccl
