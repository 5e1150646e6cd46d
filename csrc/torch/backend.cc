#include "backend.h"

#include <Python.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <cstdint>

#include "core/common/error.h"
#include "core/common/log.h"
#include "errors.h"
#include "op_helpers.h"
#include "tensors.h"
#include "work.h"

namespace weft::backend {

WeftBackend::WeftBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                         double timeout_s, const std::string& name)
    : c10d::Backend(rank, size), store_(store), monitored_barrier_bytes_(size) {
  try {
    comm_ = std::make_unique<Communicator>(store_, rank, size, "torch/" + name, timeout_s);
  } catch (...) {
    rethrow_as_torch_error(std::current_exception());
  }
  init();
}

WeftBackend::~WeftBackend() {
  // Tearing down joins weft's worker threads, which may be dropping the last
  // reference to a tensor that has a Python object and so wait for the GIL.
  // torch < 2.5 destroys a Reducer's process group with the GIL held.
  PyThreadState* released = nullptr;
  if (Py_IsInitialized() && PyGILState_Check()) released = PyEval_SaveThread();
  device_paths_.clear();
  comm_.reset();
  if (released != nullptr) PyEval_RestoreThread(released);
}

void WeftBackend::abort() { comm_->abort("ProcessGroup.abort() on rank " + std::to_string(rank_)); }

void WeftBackend::shutdown() {
  comm_->leave("destroy_process_group() on rank " + std::to_string(rank_));
}

void WeftBackend::setTimeout(std::chrono::milliseconds timeout) {
  try {
    comm_->set_timeout(std::chrono::duration<double>(timeout).count());
  } catch (const weft::Error&) {
    rethrow_as_torch_error(std::current_exception());
  }
}

c10::intrusive_ptr<c10d::Work> WeftBackend::launch(c10d::OpType type, bool async,
                                                   std::vector<at::Tensor> outputs,
                                                   std::vector<at::Tensor> keep_alive,
                                                   std::function<void()> finish,
                                                   const std::function<Works(bool)>& start) {
  Works works;
  try {
    works = start(async);
  } catch (...) {
    rethrow_as_torch_error(std::current_exception());
  }
  if (!async) {
    run_finishing_step(finish);
    const int source = works.empty() ? -1 : works.back()->source();
    return c10::make_intrusive<BackendWork>(rank_, type, std::move(outputs), source);
  }
  auto work = c10::make_intrusive<BackendWork>(rank_, type, std::move(outputs),
                                               std::move(keep_alive), std::move(finish));
  work->track(works);
  if (type == c10d::OpType::SEND || type == c10d::OpType::RECV ||
      type == c10d::OpType::RECVANYSOURCE) {
    work->bound_waits(comm_->timeout_s());
  }
  return work;
}

c10::intrusive_ptr<c10d::Work> WeftBackend::gather_then(
    c10d::OpType type, bool async, const at::Tensor& contribution, std::vector<at::Tensor> outputs,
    std::function<void(const at::Tensor&)> deliver) {
  at::Tensor mine = contribution.contiguous();
  std::vector<int64_t> shape{size_};
  shape.insert(shape.end(), mine.sizes().begin(), mine.sizes().end());
  at::Tensor gathered = at::empty(shape, mine.options());
  return launch(
      type, async, std::move(outputs), {mine, gathered},
      [gathered, deliver = std::move(deliver)] { deliver(gathered); },
      [&](bool a) {
        return Works{comm_->allgather(mine.data_ptr(), gathered.data_ptr(), mine.nbytes(),
                                      DataType::UInt8, a)};
      });
}

c10::Stream WeftBackend::stream_for(c10::Device device) {
  std::lock_guard<std::mutex> lock(streams_mutex_);
  for (const c10::Stream& stream : streams_) {
    if (stream.device() == device) return stream;
  }
  streams_.push_back(c10::impl::VirtualGuardImpl(device.type()).getStreamFromGlobalPool(device));
  return streams_.back();
}

CudaStaging WeftBackend::staging(c10::Device device, const char* what) {
  WEFT_LOG_CALL(rank_, this, what << " of CUDA tensors through pinned host staging");
  return CudaStaging(device, stream_for(device), what);
}

c10::intrusive_ptr<c10d::Work> WeftBackend::barrier(const c10d::BarrierOptions& opts) {
  return launch(c10d::OpType::BARRIER, is_async(opts, 0), {}, {}, {},
                [&](bool a) { return Works{comm_->barrier(a)}; });
}

}  // namespace weft::backend
