// The c10d::Work of one weft operation. It completes when every core Work it
// tracks has, after running the operation's finishing step (copies out of
// staging buffers) on the thread that completed the last of them. Its future
// (created on first request) then holds the output tensors.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <vector>

#include "core/exec/work.h"

namespace weft::backend {

class BackendWork : public c10d::Work {
 public:
  // An operation that has already finished (a blocking call).
  BackendWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs, int source = -1);
  // An operation still running in the core. `keep_alive` holds the tensors
  // the core reads or writes until then; `finish` may be empty.
  BackendWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs,
              std::vector<at::Tensor> keep_alive, std::function<void()> finish);

  // Call once, right after construction of a running operation.
  void track(const std::vector<std::shared_ptr<weft::Work>>& works);
  // For point-to-point operations, whose requests can wait for a message that
  // never comes: wait() without a timeout waits up to timeout_s, and a wait
  // that times out withdraws the requests (weft::Work::request_cancel), so
  // the Work fails with the reason instead of waiting on.
  void bound_waits(double timeout_s);
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;

  int sourceRank() const override;
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;

 private:
  void core_work_done(std::exception_ptr error, int source);
  void complete(std::exception_ptr error);
  c10::intrusive_ptr<c10::ivalue::Future> make_future() const;
  void settle(c10::ivalue::Future& future) const;

  const std::vector<at::Tensor> outputs_;
  std::vector<at::Tensor> keep_alive_;
  std::function<void()> finish_;
  // Guarded by the base class's mutex_.
  size_t pending_ = 0;
  std::exception_ptr first_error_;
  int source_ = -1;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::vector<std::shared_ptr<weft::Work>> works_;  // the tracked core Works
  std::optional<double> bounded_wait_s_;            // set by bound_waits
};

// Runs an operation's finishing step (copies into the caller's tensors),
// outside autograd; nothing when `finish` is empty.
void run_finishing_step(const std::function<void()>& finish);

}  // namespace weft::backend
