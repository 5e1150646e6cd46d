// The Work of an operation that ran on weft's stream of a device and has
// finished on the host: wait() makes the caller's current stream wait for
// weft's stream, and the future is a CUDA future completed there.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>

#include <torch/csrc/distributed/c10d/Work.hpp>
#include <vector>

namespace weft::backend {

class DeviceWork : public c10d::Work {
 public:
  // Call with the operation's last work queued on `stream`.
  DeviceWork(int rank, c10d::OpType type, c10::Stream stream, std::vector<at::Tensor> result);

  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  std::vector<at::Tensor> result() override { return result_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  const c10::Device device_;
  const std::vector<at::Tensor> result_;
  c10::Event done_;
  const c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace weft::backend
