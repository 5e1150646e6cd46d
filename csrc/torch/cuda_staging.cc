#include "cuda_staging.h"

#include <ATen/core/ivalue.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include "errors.h"
#include "work.h"

namespace weft::backend {
c10::Stream current_stream(c10::Device device) {
  return c10::impl::VirtualGuardImpl(device.type()).getStream(device);
}

void wait_for_current_stream(c10::Stream stream) {
  c10::Event ready(stream.device_type());
  ready.record(current_stream(stream.device()));
  ready.block(stream);
}

std::optional<c10::Device> cuda_device_of(at::TensorList tensors) {
  for (const at::Tensor& t : tensors) {
    if (t.defined() && t.is_cuda()) return t.device();
  }
  return std::nullopt;
}

std::optional<c10::Device> cuda_device_of(const std::vector<std::vector<at::Tensor>>& lists) {
  for (const auto& list : lists) {
    if (auto device = cuda_device_of(list)) return device;
  }
  return std::nullopt;
}

CudaStaging::CudaStaging(c10::Device device, c10::Stream stream, const char* what)
    : device_(device), stream_(stream), what_(what) {
  wait_for_current_stream(stream_);
}

at::Tensor CudaStaging::twin(const at::Tensor& t, bool in, bool out) {
  if (!t.defined() || !t.is_cuda()) return t;
  TORCH_CHECK(t.device() == device_, "weft ", what_, ": tensors on ", device_, " and ", t.device(),
              "; one operation takes the tensors of one device");
  TORCH_CHECK(t.layout() == at::kStrided, "weft ", what_, ": only dense tensors are supported");
  for (const auto& [tensor, host] : twins_) {
    if (tensor.is_same(t)) return host;
  }
  // Same strides where t is dense: the host operation sees t's layout.
  at::Tensor host = at::empty_like(t, t.options().device(at::kCPU).pinned_memory(true));
  {
    c10::StreamGuard guard(stream_);
    if (in) host.copy_(t, /*non_blocking=*/true);
    t.record_stream(stream_);
  }
  twins_.emplace_back(t, host);
  if (out) outputs_.emplace_back(t, host);
  return host;
}

std::vector<at::Tensor> CudaStaging::twins(const std::vector<at::Tensor>& tensors, bool in,
                                           bool out) {
  std::vector<at::Tensor> hosts;
  for (const at::Tensor& t : tensors) hosts.push_back(twin(t, in, out));
  return hosts;
}

std::vector<std::vector<at::Tensor>> CudaStaging::twins(
    const std::vector<std::vector<at::Tensor>>& lists, bool in, bool out) {
  std::vector<std::vector<at::Tensor>> hosts;
  for (const auto& list : lists) hosts.push_back(twins(list, in, out));
  return hosts;
}

at::Tensor CudaStaging::original_of(const at::Tensor& twin) const {
  for (const auto& [tensor, host] : twins_) {
    if (host.is_same(twin)) return tensor;
  }
  return twin;
}

c10::intrusive_ptr<c10d::Work> CudaStaging::run(
    int rank, const std::function<c10::intrusive_ptr<c10d::Work>()>& start) {
  stream_.synchronize();
  c10::intrusive_ptr<c10d::Work> host = start();
  std::vector<at::Tensor> result;
  for (const at::Tensor& t : host->result()) result.push_back(original_of(t));
  auto work = c10::make_intrusive<StagedWork>(rank, device_, stream_, std::move(host),
                                              std::move(result), std::move(outputs_));
  work->start();
  return work;
}

StagedWork::StagedWork(int rank, c10::Device device, c10::Stream stream,
                       c10::intrusive_ptr<c10d::Work> host, std::vector<at::Tensor> result,
                       std::vector<std::pair<at::Tensor, at::Tensor>> copies_back)
    : c10d::Work(rank, host->retrieveOpType()),
      device_(device),
      stream_(stream),
      host_(std::move(host)),
      result_(std::move(result)),
      copies_back_(std::move(copies_back)),
      done_(device.type()),
      future_(c10::make_intrusive<c10::ivalue::Future>(
          c10::ListType::create(c10::TensorType::get()), std::vector<c10::Device>{device})) {}

void StagedWork::start() {
  // The host Work's future holds this Work until the host operation ends.
  host_->getFuture()->addCallback(
      [self = c10::intrusive_ptr<StagedWork>::reclaim_copy(this)](c10::ivalue::Future& host) {
        self->host_done(host.hasError() ? host.exception_ptr() : nullptr);
      });
}

void StagedWork::host_done(std::exception_ptr error) {
  if (!error) {
    try {
      c10::StreamGuard guard(stream_);
      run_finishing_step([this] {
        for (auto& [tensor, host] : copies_back_) tensor.copy_(host, /*non_blocking=*/true);
      });
      done_.record(stream_);
      // A CUDA future: completed on weft's stream, its users wait for it.
      future_->markCompleted(c10::IValue(result_));
    } catch (...) {
      error = to_torch_error(std::current_exception());
    }
  }
  if (error) future_->setError(error);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    completed_ = true;
    exception_ = error;
    copies_back_.clear();
  }
  cv_.notify_all();
}

bool StagedWork::wait(std::chrono::milliseconds timeout) {
  const bool finished = c10d::Work::wait(timeout);
  done_.block(current_stream(device_));
  return finished;
}

}  // namespace weft::backend
