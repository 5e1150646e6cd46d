// CUDA tensors that neither GPU path (core/device/: nccl, cuda_ipc) serves:
// each CUDA tensor of an operation gets a pinned host twin, the operation
// runs on the twins over shm/tcp like any CPU operation, and the outputs are
// copied back. Stream semantics are ProcessGroupNCCL's:
// - the copies run on weft's own stream of the device, after the work queued
//   so far on the caller's current stream (an event);
// - Work.wait() makes the caller's current stream wait for the copies back,
//   and the Work's future is a CUDA future (its users' streams wait too);
// - the CUDA tensors are recorded on weft's stream for the caching allocator.
// Unlike NCCL, the calling thread waits for the copies to the host (and so
// for the GPU work queued before the call) before the operation starts.
//
// Only device-generic c10 calls (streams, events, guards) are used: this
// builds against any torch, and CUDA tensors exist only with a CUDA torch.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>

#include <functional>
#include <optional>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <utility>
#include <vector>

namespace weft::backend {

// The device of the first CUDA tensor, if any.
std::optional<c10::Device> cuda_device_of(at::TensorList tensors);
std::optional<c10::Device> cuda_device_of(const std::vector<std::vector<at::Tensor>>& lists);
template <class A, class B>
std::optional<c10::Device> cuda_device_of(const A& a, const B& b) {
  auto device = cuda_device_of(a);
  return device ? device : cuda_device_of(b);
}

// The caller's current stream on `device`.
c10::Stream current_stream(c10::Device device);

// Makes `stream` wait for the work queued so far on the caller's current
// stream of its device.
void wait_for_current_stream(c10::Stream stream);

class CudaStaging {
 public:
  // `stream` is weft's stream on `device`; it waits for the caller's current
  // stream. `what` names the operation in errors.
  CudaStaging(c10::Device device, c10::Stream stream, const char* what);

  // The host twin of `t` (t itself on the CPU): a copy of t when `in`, and
  // copied back into t once the operation succeeded when `out`.
  at::Tensor twin(const at::Tensor& t, bool in, bool out);
  std::vector<at::Tensor> twins(const std::vector<at::Tensor>& tensors, bool in, bool out);
  std::vector<std::vector<at::Tensor>> twins(const std::vector<std::vector<at::Tensor>>& lists,
                                             bool in, bool out);

  // Waits for the copies to the host, starts the operation on the twins
  // with `start` and returns its Work for the caller's tensors.
  c10::intrusive_ptr<c10d::Work> run(int rank,
                                     const std::function<c10::intrusive_ptr<c10d::Work>()>& start);

 private:
  at::Tensor original_of(const at::Tensor& twin) const;

  c10::Device device_;
  c10::Stream stream_;
  const char* what_;
  std::vector<std::pair<at::Tensor, at::Tensor>> twins_;    // (tensor, twin)
  std::vector<std::pair<at::Tensor, at::Tensor>> outputs_;  // (tensor, twin) to copy back
};

// The Work of a staged operation: completes once the host operation has and
// the copies back are queued on weft's stream.
class StagedWork : public c10d::Work {
 public:
  StagedWork(int rank, c10::Device device, c10::Stream stream, c10::intrusive_ptr<c10d::Work> host,
             std::vector<at::Tensor> result,
             std::vector<std::pair<at::Tensor, at::Tensor>> copies_back);

  // Call once, right after construction.
  void start();

  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  int sourceRank() const override { return host_->sourceRank(); }
  std::vector<at::Tensor> result() override { return result_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  void host_done(std::exception_ptr error);

  const c10::Device device_;
  const c10::Stream stream_;
  const c10::intrusive_ptr<c10d::Work> host_;
  const std::vector<at::Tensor> result_;
  std::vector<std::pair<at::Tensor, at::Tensor>> copies_back_;
  c10::Event done_;
  const c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace weft::backend
